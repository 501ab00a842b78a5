"""The web chat at `/` in headless Chromium (Debian's chromium + chromedriver):
type a message, see the streamed answer and the status line, keep a screenshot."""

import shutil
import tempfile

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from conftest import OUT, start_server, stop_server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def page_server():
    s = start_server("native")
    yield s
    stop_server(s)


@pytest.fixture
def browser():
    profile = tempfile.mkdtemp(prefix="kore-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={profile}", "--window-size=1280,900"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def test_chat_page_streams_an_answer_with_its_status_line(page_server, browser):
    browser.get(page_server.url + "/")
    wait = WebDriverWait(browser, 60)
    wait.until(lambda d: d.find_element(By.ID, "model").text.startswith("tiny"))
    browser.find_element(By.ID, "max-tokens").send_keys("40")
    box = browser.find_element(By.ID, "input")
    # First with thinking (on by default): the reasoning streams into a folded block.
    box.send_keys("Tell me about the king.", Keys.ENTER)
    wait.until(lambda d: "tok/s" in d.find_element(By.ID, "status").text)
    status = browser.find_element(By.ID, "status").text
    assert "40 tokens" in status and "context" in status and "tokens/step" in status, status
    thinking = browser.find_element(By.CSS_SELECTOR, "details.thinking")
    assert not thinking.get_attribute("open"), "thinking not folded after the answer"
    assert thinking.get_attribute("textContent").strip(), "no thinking text"
    assert browser.find_element(By.ID, "stop").get_attribute("disabled")
    # Then without thinking: the answer itself streams into the bubble.
    browser.find_element(By.ID, "thinking").click()
    box.send_keys("And the queen?", Keys.ENTER)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant")) == 2
               and "tok/s" in d.find_element(By.ID, "status").text
               and d.find_element(By.ID, "stop").get_attribute("disabled"))
    answer = browser.find_elements(By.CSS_SELECTOR, ".msg.assistant")[1]
    assert answer.text.strip(), "empty answer"
    OUT.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(OUT / "webchat.png"))
    # New chat (keyboard: the button's access key also works) empties the log.
    browser.find_element(By.ID, "new-chat").click()
    assert not browser.find_elements(By.CSS_SELECTOR, ".msg")
