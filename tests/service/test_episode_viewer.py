"""Every episode can be read afterwards: each ending is recorded (graded or not), `GET /episodes`
lists them, and the viewer shows one as a conversation in a real headless browser (Chromium), behind
the service's token, never showing a hidden test.

The browser is Debian's `chromium` and `chromium-driver`, which `.ci/run` installs."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.wait import WebDriverWait

from tests.service.conftest import HttpSession
from tests.service.test_episode_end import ADD_SOLUTION, ADD_TASK
from tests.support.service import RunningService, SharedServices

HIDDEN_MARK = "assert add(1, 2) == 3"
"""A line of the task's hidden test: no page may show it."""
TOKEN = "viewer-test-token"


def _episodes(client: httpx.Client) -> dict[str, dict]:
    page = client.get("/episodes", params={"limit": 1000})
    assert page.status_code == 200, page.text
    return {summary["episode_id"]: summary for summary in page.json()["episodes"]}


def test_every_ending_is_recorded_and_listed(session: HttpSession, service: RunningService) -> None:
    client = session.client
    left = session.reset(task=ADD_TASK, episode_id="viewer-abandoned")
    assert left["observation"]["task_id"] == "inline/add"
    session.step("bash", {"command": "ls"})
    session.reset(task={**ADD_TASK, "limits": {"max_steps": 1}}, episode_id="viewer-step-limit")
    assert session.step("bash", {"command": "true"})["done"] is True
    session.reset(task=ADD_TASK, episode_id="viewer-submitted")
    session.step("write_file", {"path": "solution.py", "content": ADD_SOLUTION})
    assert session.step("submit")["reward"] == 1.0
    closing = HttpSession(client)
    closing.reset(task=ADD_TASK, episode_id="viewer-closed")
    closing.step("bash", {"command": "pytset"})
    closing.close()
    untouched = HttpSession(client)
    untouched.reset(task=ADD_TASK, episode_id="viewer-no-step")
    untouched.close()

    listed = _episodes(client)
    endings = {episode: listed[episode]["ending"] for episode in
               ("viewer-abandoned", "viewer-step-limit", "viewer-submitted", "viewer-closed")}
    assert endings == {"viewer-abandoned": "abandoned", "viewer-step-limit": "step_limit",
                       "viewer-submitted": "submitted", "viewer-closed": "closed"}
    assert "viewer-no-step" not in listed  # nothing happened in it
    assert listed["viewer-submitted"]["reward"] == 1.0 and listed["viewer-abandoned"]["reward"] is None
    assert listed["viewer-closed"]["error_kinds"] == {"command_not_found": 1}
    record = client.get("/episodes/viewer-closed").json()
    assert record["ending"] == "closed" and record["steps"][0]["action"]["arguments"] == {"command": "pytset"}
    assert client.get("/episodes/no-such-episode").json()["code"] == "not_found"

    # The trajectory file holds the same endings, unfinished episodes included.
    written = [json.loads(line) for line in (service.settings.trajectory_dir / "episodes.jsonl").read_text().splitlines()]
    assert {line["episode_id"]: line["ending"] for line in written if line["episode_id"] in endings} == endings


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    driver_path = shutil.which("chromedriver")
    assert driver_path, "the viewer test needs Debian's chromium and chromium-driver (`apt-get install chromium chromium-driver`; .ci/run does)"
    options = webdriver.ChromeOptions()
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=DriverService(driver_path))
    try:
        yield driver
    finally:
        driver.quit()


def _navigate_by(browser: webdriver.Chrome, element: WebElement) -> None:
    """Click `element` and return once the page it leads to has loaded: a click, unlike `get`, returns
    before the navigation it starts, and the old page would answer the next lookup. The old document
    carries a mark that a new one lacks; Chrome answers lookups made mid-navigation with assorted
    errors (a stale element, or 'Node with given id does not belong to the document'), so any
    WebDriver error there means 'not yet'."""
    browser.execute_script("window.__coding_env_old_page = true")
    element.click()
    WebDriverWait(browser, 60, ignored_exceptions=(WebDriverException,)).until(
        lambda driver: driver.execute_script("return window.__coding_env_old_page === undefined && document.readyState === 'complete'")
    )


def test_the_viewer_shows_an_episode_as_a_conversation_behind_the_token(services: SharedServices, browser: webdriver.Chrome, tmp_path: Path) -> None:
    service = services.get(api_token=TOKEN, pool_size=1, grading_pool_size=1)
    with httpx.Client(base_url=service.url, timeout=120, headers={"authorization": f"Bearer {TOKEN}"}) as client:
        session = HttpSession(client)
        session.reset(task=ADD_TASK, episode_id="viewer-page", show_hints=True)
        mistaken = session.step("bash", {"command": "pytset -q"})
        assert mistaken["observation"]["error_kind"] == "command_not_found" and mistaken["observation"]["hint"]
        session.step("write_file", {"path": "solution.py", "content": "def add(a, b):\n    return a - b\n"})
        assert session.step("submit")["reward"] == 0.0

    # Without the token: refused, like every other route.
    browser.get(f"{service.url}/viewer")
    assert "unauthorized" in browser.find_element(By.TAG_NAME, "body").text
    browser.get(f"{service.url}/viewer/login")
    browser.find_element(By.NAME, "token").send_keys("wrong")
    _navigate_by(browser, browser.find_element(By.CSS_SELECTOR, "button[type=submit]"))
    assert "not this service's" in browser.find_element(By.TAG_NAME, "body").text
    browser.find_element(By.NAME, "token").send_keys(TOKEN)
    _navigate_by(browser, browser.find_element(By.CSS_SELECTOR, "button[type=submit]"))

    assert browser.find_element(By.TAG_NAME, "h1").text == "Recent episodes"
    row = next(row for row in browser.find_elements(By.CSS_SELECTOR, "tbody tr") if "command_not_found" in row.text)
    assert "inline/add" in row.text and "submitted" in row.text
    _navigate_by(browser, row.find_element(By.TAG_NAME, "a"))

    page = browser.find_element(By.TAG_NAME, "body").text
    roles = [element.text.lower() for element in browser.find_elements(By.CSS_SELECTOR, ".turn .role")]
    assert roles[0] == "task" and roles[1] == "step 1" and roles[2] == "bash answered (exit 127)" and roles[-1] == "episode ended"
    assert "pytset -q" in page and "command_not_found" in page  # the call, its error kind
    assert mistaken["observation"]["hint"] in page  # the hint the agent was shown
    assert "submitted · reward 0 · tests 0/1" in page
    assert HIDDEN_MARK not in browser.page_source and "test_hidden_add" not in browser.page_source
    browser.get(f"{service.url}/viewer/no-such-episode")
    assert browser.find_element(By.TAG_NAME, "h1").text == "No episode no-such-episode"
    browser.back()
    browser.save_screenshot(str(tmp_path / "episode.png"))
    assert (tmp_path / "episode.png").stat().st_size > 0

    # The viewer's cookie opens its pages and nothing else.
    cookie = {"coding_env_viewer": TOKEN}
    assert httpx.get(f"{service.url}/episodes", cookies=cookie).status_code == 401
    assert httpx.post(f"{service.url}/sessions", cookies=cookie).status_code == 401
