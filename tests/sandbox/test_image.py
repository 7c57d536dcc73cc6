"""Building the sandbox image: `--if-missing` rebuilds an image left by another recipe."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox.docker_backend import default_client
from sandbox.image import RECIPE_LABEL, build_image, recipe_digest
from sandbox.spec import DEFAULT_IMAGE
from tests.sandbox.support import needs_docker

pytestmark = needs_docker

STALE_TAG = "coding-env-sandbox:test-stale-recipe"


@pytest.fixture
def stale_image() -> Iterator[str]:
    """An image under a scratch tag carrying another recipe's label, as an older checkout would have left it."""
    client = default_client()
    container = client.containers.create(DEFAULT_IMAGE, command=["true"])
    try:
        container.commit(*STALE_TAG.split(":"), conf={"Labels": {RECIPE_LABEL: "an-older-recipe"}})
    finally:
        container.remove()
    yield STALE_TAG
    client.images.remove(STALE_TAG, force=True)


def test_if_missing_rebuilds_an_image_from_another_recipe_and_keeps_a_current_one(stale_image: str) -> None:
    images = default_client().images
    stale_id = images.get(stale_image).id
    build_image(if_missing=True, tag=stale_image)
    rebuilt = images.get(stale_image)
    assert rebuilt.id != stale_id and rebuilt.labels[RECIPE_LABEL] == recipe_digest()
    build_image(if_missing=True, tag=stale_image)
    assert images.get(stale_image).id == rebuilt.id
