"""Building the sandbox image from a registry base or, offline, from a debootstrap rootfs.

One Dockerfile (sandbox/images/Dockerfile) serves both paths; only its BASE differs. The
offline base is a Debian rootfs made by debootstrap and loaded with `docker import`, which
already carries python3, pytest and git, so the build needs no network. See
docs/decisions/004-sandbox-image-build.md.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
from importlib.resources import files
from pathlib import Path

import docker
import docker.errors

from sandbox.docker_backend import default_client
from sandbox.spec import DEFAULT_IMAGE, DEFAULT_REMOVED_BINARIES

log = logging.getLogger(__name__)

REGISTRY_BASE = "python:3.12-slim"
"""Base image used where a registry is reachable."""

OFFLINE_BASE = "coding-env-rootfs:bookworm"
"""Name under which the debootstrap rootfs is imported."""

ROOTFS_DIR = Path("/var/cache/coding-env/rootfs-bookworm")
"""Where the debootstrap rootfs is kept between builds (debootstrap takes minutes)."""

RECIPE_LABEL = "coding-env.recipe"
"""Label on a built image: a digest of what it was built from (the Dockerfile and the removed binaries),
so that an image left by an older checkout is rebuilt, not used."""

DEBOOTSTRAP_PACKAGES = ("python3", "python3-pytest", "git", "ca-certificates", "bash-static")
PACKAGES_LABEL = "coding-env.packages"
"""Label on the imported rootfs: the packages it was debootstrapped with, so that a rootfs from an older
list (one without bash-static, say) is made anew, not built on."""
DEBIAN_MIRROR = "http://deb.debian.org/debian"


def image_exists(name: str, client: docker.DockerClient | None = None) -> bool:
    try:
        (client or default_client()).images.get(name)
    except docker.errors.ImageNotFound:
        return False
    return True


def recipe_digest(removed_binaries: tuple[str, ...] = DEFAULT_REMOVED_BINARIES) -> str:
    """Digest of what the sandbox image is built from: this checkout's Dockerfile and the binaries it removes
    (not the base, which `build_image` chooses by what is reachable)."""
    dockerfile = (files("sandbox") / "images" / "Dockerfile").read_bytes()
    return hashlib.sha256(dockerfile + b"\0" + " ".join(removed_binaries).encode()).hexdigest()[:16]


def _image_is_current(tag: str, removed_binaries: tuple[str, ...], client: docker.DockerClient) -> bool:
    try:
        labels = client.images.get(tag).labels or {}
    except docker.errors.ImageNotFound:
        return False
    return labels.get(RECIPE_LABEL) == recipe_digest(removed_binaries)


def build_image(
    offline: bool | None = None,
    if_missing: bool = False,
    base: str = REGISTRY_BASE,
    tag: str = DEFAULT_IMAGE,
    removed_binaries: tuple[str, ...] = DEFAULT_REMOVED_BINARIES,
    client: docker.DockerClient | None = None,
) -> str:
    """Build the sandbox image and return its tag.

    offline: True builds on the debootstrap rootfs, False on `base` from a registry, None tries
    the registry and falls back to the rootfs. if_missing: do nothing when `tag` exists and was built
    from this checkout's recipe (`RECIPE_LABEL`); an image from another recipe is rebuilt.
    """
    client = client or default_client()
    if if_missing and _image_is_current(tag, removed_binaries, client):
        log.info("image %s exists and is current; not rebuilding", tag)
        return tag
    if offline is None:
        try:
            return _build(client, _registry_base(client, base), tag, removed_binaries)
        except docker.errors.DockerException as exc:
            log.warning("registry build failed (%s); building from the offline rootfs", exc)
            offline = True
    return _build(client, offline_base(client) if offline else _registry_base(client, base), tag, removed_binaries)


def _registry_base(client: docker.DockerClient, base: str) -> str:
    if not image_exists(base, client):
        log.info("pulling %s", base)
        client.images.pull(base)
    return base


def _build(client: docker.DockerClient, base: str, tag: str, removed_binaries: tuple[str, ...]) -> str:
    log.info("building %s on %s", tag, base)
    client.images.build(
        path=str(files("sandbox") / "images"),
        tag=tag,
        buildargs={"BASE": base, "REMOVED_BINARIES": " ".join(removed_binaries)},
        labels={RECIPE_LABEL: recipe_digest(removed_binaries)},
        pull=False,
        rm=True,
        forcerm=True,
    )
    return tag


def offline_base(client: docker.DockerClient | None = None) -> str:
    """The imported rootfs image, importing (and if need be debootstrapping) it first; a rootfs, imported or
    kept, that lacks one of DEBOOTSTRAP_PACKAGES is made anew."""
    client = client or default_client()
    packages = " ".join(DEBOOTSTRAP_PACKAGES)
    try:
        if (client.images.get(OFFLINE_BASE).labels or {}).get(PACKAGES_LABEL) == packages:
            return OFFLINE_BASE
    except docker.errors.ImageNotFound:
        pass
    if not all(_installed(ROOTFS_DIR, package) for package in DEBOOTSTRAP_PACKAGES):
        shutil.rmtree(ROOTFS_DIR, ignore_errors=True)
        _debootstrap(ROOTFS_DIR)
    log.info("importing %s as %s", ROOTFS_DIR, OFFLINE_BASE)
    repository, _, tag_name = OFFLINE_BASE.partition(":")
    with subprocess.Popen(["tar", "-C", str(ROOTFS_DIR), "-c", "."], stdout=subprocess.PIPE) as tar:
        client.api.import_image(
            src=tar.stdout, repository=repository, tag=tag_name, stream_src=True, changes=[f'LABEL {PACKAGES_LABEL}="{packages}"']
        )
    if tar.returncode != 0:
        raise RuntimeError(f"tar of {ROOTFS_DIR} failed with exit code {tar.returncode}")
    return OFFLINE_BASE


def _installed(root: Path, package: str) -> bool:
    """Whether dpkg in the rootfs at `root` lists `package` as installed (a multi-arch one under `package:ARCH`)."""
    info = root / "var" / "lib" / "dpkg" / "info"
    return (info / f"{package}.list").exists() or any(info.glob(f"{package}:*.list"))


def _debootstrap(target: Path) -> None:
    if shutil.which("debootstrap") is None:
        raise RuntimeError("the offline build needs debootstrap (apt-get install debootstrap) or a rootfs at " + str(target))
    log.info("debootstrapping Debian bookworm into %s (a few minutes)", target)
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["debootstrap", "--variant=minbase", "--include=" + ",".join(DEBOOTSTRAP_PACKAGES), "bookworm", str(target), DEBIAN_MIRROR],
        check=True,
    )
