"""The sense explorer page in a real headless browser (Debian's chromium and
chromedriver, driven by selenium; `make test` installs them) against a real ``elmo
serve``: type a sentence, click a word, read the nearest uses and the sense map, open a
hit in context. A screenshot is kept in runs/test-artifacts/."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_helpers import REPO, running_server, served_data

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
WAIT_S = 60


def _binary(names: tuple[str, ...]) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError(f"none of {', '.join(names)} is installed: run `make test` (it "
                       "installs chromium and chromium-driver) or apt-get install them")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = served_data(tmp_path_factory)
    log = tmp_path_factory.mktemp("serve_browser") / "server.log"
    with running_server(data, log=log) as url:
        yield url


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _binary(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 "--disable-gpu", "--window-size=1400,1000", "--no-proxy-server",
                 f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    service = Service(executable_path=_binary(("chromedriver",)))
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.mark.slow
def test_explorer_page_searches_maps_and_shows_context(server: str, browser: object,
                                                       tmp_path: Path) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    driver = browser
    # A list the page replaces while a condition reads it is read again, not an error.
    wait = WebDriverWait(driver, WAIT_S, ignored_exceptions=(StaleElementReferenceException,))
    driver.get(server + "/")
    # The page loads plotly.js from the server itself, not from a CDN.
    scripts = [s.get_attribute("src") for s in driver.find_elements(By.TAG_NAME, "script")]
    assert f"{server}/static/plotly.min.js" in scripts
    assert driver.execute_script("return typeof Plotly") == "object"
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#index option"))
    assert "source" in driver.find_element(By.ID, "fields").text

    driver.find_element(By.ID, "sentence").send_keys("Will you play upon this pipe ?")
    driver.find_element(By.ID, "show-words").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#tokens .token")) == 7)
    words = driver.find_elements(By.CSS_SELECTOR, "#tokens .token")
    assert [w.text for w in words][:3] == ["Will", "you", "play"]
    words[2].click()

    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#results .hit")) == 10)
    hits = driver.find_elements(By.CSS_SELECTOR, "#results .hit")
    marks = [h.find_element(By.TAG_NAME, "mark").text.lower() for h in hits]
    assert all(m.startswith("pla") for m in marks)  # play and its forms, highlighted
    first = hits[0].text
    assert "Will you play upon this pipe?" in first and "shakespeare_play.txt" in first
    # its position: sentence and token (the bundled model cuts a line into sentences)
    assert re.search(r"#\d+\.\d+", first), first

    # The sense map: one plotly trace per sense, dots drawn.
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#sense-map .scatterlayer .point"))
    traces = driver.execute_script(
        "return document.getElementById('sense-map').data.length")
    assert traces >= 2
    assert len(driver.find_elements(By.CSS_SELECTOR, "#sense-names li")) == traces

    hits[1].click()
    context = wait.until(ec.visibility_of_element_located((By.ID, "context")))
    focus = context.find_element(By.CSS_SELECTOR, ".focus")
    assert focus.find_element(By.TAG_NAME, "mark").text.lower().startswith("pla")
    assert focus.text in hits[1].text

    # A document-field filter: only hits from that source.
    box = driver.find_element(By.ID, "filters")
    box.send_keys("source~moby_dick_play")
    driver.find_element(By.ID, "close-context").click()
    driver.find_elements(By.CSS_SELECTOR, "#tokens .token")[2].click()
    wait.until(lambda d: all("moby_dick_play.txt" in h.text for h in
                             d.find_elements(By.CSS_SELECTOR, "#results .hit")))
    # The sense map follows the filter box: every dot from that source.
    wait.until(lambda d: d.execute_script(
        "const m = document.getElementById('sense-map'); return m.data && m.data.length"))

    # Senses per group of a document field: stacked bars, a group's uses on a click.
    box.clear()
    Select(driver.find_element(By.ID, "by")).select_by_value("source")
    driver.find_elements(By.CSS_SELECTOR, "#tokens .token")[2].click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#groups .group")) == 2)
    bars = driver.execute_script(
        "const t = document.getElementById('sense-time'); "
        "return t.data.map((trace) => [trace.type, trace.x.length])")
    assert len(bars) >= 2 and all(kind == "bar" and n == 2 for kind, n in bars)
    assert "share of the word" in driver.find_element(By.ID, "sense-time").text
    # Nothing drawn over anything: the legend clear of the x-axis title, and the map's
    # title (the page's, above the plot) clear of plotly's toolbar.
    overlap = """const box = (s) => { const e = document.querySelector(s);
        return e && e.getBoundingClientRect(); };
      const a = box(arguments[0]), b = box(arguments[1]);
      if (!a || !b) return null;
      return a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;"""
    assert driver.execute_script(overlap, "#sense-time .legend", "#sense-time .g-xtitle") \
        is False
    assert driver.find_element(By.ID, "sense-map-title").text.startswith("“play”")
    assert driver.execute_script(overlap, "#sense-map-title", "#sense-map .modebar") \
        is not True
    group = driver.find_elements(By.CSS_SELECTOR, "#groups .group")[0]
    assert group.text.endswith(")") and "moby_dick_play.txt (" in group.text
    group.click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#group-uses .hit"))
    uses = driver.find_elements(By.CSS_SELECTOR, "#group-uses .hit")
    assert all("moby_dick_play.txt" in u.text and u.text.startswith("sense ") for u in uses)
    uses[0].click()
    context = wait.until(ec.visibility_of_element_located((By.ID, "context")))
    assert context.find_element(By.CSS_SELECTOR, ".focus mark").text.lower() == "play"

    shot = tmp_path / "sense-explorer.png"
    assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    artifacts = REPO / "runs" / "test-artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, artifacts / shot.name)
    driver.execute_script("document.getElementById('context').hidden = true")
    for part in ("sense-map-title", "over-time-title"):  # each plot whole, with its title
        section = driver.find_element(By.ID, part).find_element(By.XPATH, "..")
        driver.execute_script("arguments[0].scrollIntoView()", section)
        section.screenshot(str(artifacts / f"{part.removesuffix('-title')}.png"))
    logs = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not logs, logs
