"""``keyshot report`` in a real browser: headless Chromium (Debian's chromium + chromium-driver, installed
here if missing) driven by Selenium over a judged run's report. PNG screenshots of the index and of one
trajectory page are saved in ``$KEYSHOT_TEST_ARTEFACTS`` (default: the test's temporary folder)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from keyshot.infer.cli import main as keyshot
from tests.support.report_pages import judged_run

pytestmark = pytest.mark.slow

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def ensure_chromium() -> None:
    if Path(CHROMIUM).exists() and Path(DRIVER).exists():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("headless Chromium is not installed and cannot be (needs root and apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
    proc = subprocess.run(
        ["apt-get", "install", "-y", "-qq", "chromium", "chromium-driver"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0 or not Path(DRIVER).exists():
        pytest.skip(f"could not install chromium: {proc.stderr[-500:]}")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    ensure_chromium()
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1800",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    run = judged_run(tmp_path_factory.mktemp("browser-report"))
    assert keyshot(["report", str(run), "--no-progress"]) == 0
    return run / "report"


def artefacts(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("KEYSHOT_TEST_ARTEFACTS", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_index_filters_and_trajectory_pages_in_chromium(browser, report, tmp_path):
    from selenium.webdriver.common.by import By

    rows = json.loads(
        (report / "index.html").read_text().split('type="application/json">')[1].split("</script>")[0]
    )
    browser.get((report / "index.html").as_uri())
    body_rows = browser.find_elements(By.CSS_SELECTOR, "#trajectories tbody tr")
    assert len(body_rows) == len(rows) == 12
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    assert (
        browser.find_element(By.TAG_NAME, "body").get_attribute("data-pwned") is None
    )  # the planted script did not run

    browser.find_element(By.CSS_SELECTOR, '[data-filter="disagree"]').click()
    shown = browser.find_elements(By.CSS_SELECTOR, "#trajectories tbody tr")
    assert len(shown) == sum(r["agree"] is False for r in rows) > 0
    assert browser.find_element(By.ID, "count").text.startswith(f"{len(shown)} of 12")
    browser.find_element(By.CSS_SELECTOR, '[data-filter="apart"]').click()
    assert (
        len(browser.find_elements(By.CSS_SELECTOR, "#trajectories tbody tr")) == 1
    )  # the not-executable task
    browser.find_element(By.CSS_SELECTOR, '[data-filter="all"]').click()
    browser.find_element(By.CSS_SELECTOR, 'th[data-key="kept"]').click()  # sort by kept, ascending
    kept_column = 9  # agent, task id, run, task, keyshot, truth, agrees, kind, screenshots, kept
    kept = [
        int(tr.find_elements(By.TAG_NAME, "td")[kept_column].text)
        for tr in browser.find_elements(By.CSS_SELECTOR, "#trajectories tbody tr")
    ]
    assert kept == sorted(kept)
    browser.save_screenshot(str(artefacts(tmp_path) / "report-index.png"))

    planted = next(r for r in rows if r["task_id"] == "task-00000")
    browser.get((report / planted["href"]).as_uri())
    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-pwned") is None
    assert "<script>" in browser.find_element(By.CLASS_NAME, "task").text  # shown, not run

    target = next(r for r in rows if r["task_id"] == "task-00003")
    browser.get((report / target["href"]).as_uri())
    thumbs = browser.find_elements(By.CSS_SELECTOR, ".shot img")
    assert len(thumbs) == target["shots"]
    assert all(
        browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", t)
        for t in thumbs
    )
    assert len(browser.find_elements(By.CSS_SELECTOR, ".shot.kept")) == target["kept"]
    thumbs[0].click()  # click to enlarge
    assert "open" in browser.find_element(By.ID, "lightbox").get_attribute("class")
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    browser.find_element(By.ID, "lightbox").click()
    browser.save_screenshot(str(artefacts(tmp_path) / "report-trajectory.png"))
