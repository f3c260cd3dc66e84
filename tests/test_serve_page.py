"""The page at `/` in a real headless browser: Debian's chromium driven by selenium through
/usr/bin/chromedriver (never Selenium Manager, which would go to the network). It saves a
screenshot to test-output/serve-page.png."""

import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from serve_helpers import fake_server, request

from mlxmem.memory.store import Store
from mlxmem.testing import FakeEngine

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
SCREENSHOT = Path(__file__).resolve().parents[1] / "test-output" / "serve-page.png"

if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
    pytest.skip(
        "no /usr/bin/chromium or /usr/bin/chromedriver (apt-get install chromium chromium-driver)",
        allow_module_level=True,
    )
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture
def browser(tmp_path):
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,860"]:
        options.add_argument(arg)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium'}")
    service = webdriver.ChromeService(executable_path=str(CHROMEDRIVER))
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver, check, timeout=30):
    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: check())


def texts(driver, css):
    """The texts of the elements matching `css`, read at once (the page re-renders its lists
    on every refresh, so elements found one call earlier may be gone)."""
    script = "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent)"
    return driver.execute_script(script, css)


def test_the_page_chats_and_shows_and_edits_the_memory(browser):
    store = Store()
    store.add_fact("I live in Porto", source="manual")
    store.add_fact("The user has a cat named Miso.", source="automatic")
    engine = FakeEngine(lambda prompt: "Nice to meet you, and hello to Miso!", delay_s=0.01)
    with fake_server(engine) as server:
        browser.get(server.url + "/")
        wait(browser, lambda: browser.find_element(By.TAG_NAME, "body").get_attribute("data-ready"))
        facts = browser.find_elements(By.CSS_SELECTOR, "#facts .fact")
        assert [f.find_element(By.CLASS_NAME, "tag").text for f in facts] == ["manual", "automatic"]

        # A turn, streamed into the page and logged.
        browser.find_element(By.ID, "input").send_keys("Hello from the page")
        browser.find_element(By.ID, "send").click()
        reply = "Nice to meet you, and hello to Miso!"
        wait(browser, lambda: texts(browser, ".message.assistant .text") == [reply])
        wait(browser, lambda: browser.find_element(By.ID, "send").is_enabled())
        assert [(t.role, t.text) for t in store.turns("default")] == [
            ("user", "Hello from the page"),
            ("assistant", reply),
        ]

        # Edit a fact and add one from the facts panel (deleting one comes below).
        manual = browser.find_element(By.CSS_SELECTOR, "#facts .fact")
        manual.find_element(By.CLASS_NAME, "edit").click()
        field = browser.find_element(By.CSS_SELECTOR, "#facts .edit-text")
        field.clear()
        field.send_keys("I live in Lisbon")
        browser.find_element(By.CSS_SELECTOR, "#facts .save").click()
        wait(browser, lambda: [f.text for f in store.facts()][0] == "I live in Lisbon")
        browser.find_element(By.ID, "fact-input").send_keys("I keep bees")
        browser.find_element(By.CSS_SELECTOR, "#fact-form button").click()
        facts = ["I live in Lisbon", "The user has a cat named Miso.", "I keep bees"]
        wait(browser, lambda: texts(browser, "#facts .fact .text") == facts)

        # The context bar: one segment per layer in use, filling the budget, as the API says.
        layers = request(server, "GET", "/v1/memory/context")[1]["layers"]
        legend = [f"{name} {tokens}" for name, tokens in layers.items()]
        wait(browser, lambda: texts(browser, "#context-legend li") == legend)
        assert {"instructions", "facts", "turns", "reserve", "free"} <= set(bar_layers(browser))
        widths = browser.execute_script(
            "return [...document.querySelectorAll('#context-bar .layer')]"
            ".map(e => parseFloat(e.style.width))"
        )
        assert sum(widths) == pytest.approx(100, abs=0.5)
        assert "default" in texts(browser, "#conversations .open")
        wait(browser, lambda: len(browser.find_elements(By.CSS_SELECTOR, ".message")) == 2)
        SCREENSHOT.parent.mkdir(exist_ok=True)
        browser.save_screenshot(str(SCREENSHOT))

        click(browser, "#facts .fact:nth-child(2) .delete")
        wait(browser, lambda: len(store.facts()) == 2)
        wait(browser, lambda: texts(browser, "#facts .fact .text") == facts[::2])
        assert [(f.text, f.source) for f in store.facts()] == [
            ("I live in Lisbon", "manual"),
            ("I keep bees", "manual"),
        ]
        # A replaced fact stays listed, after the current ones, with what replaced it.
        lisbon = store.facts()[0].id
        moved = {"text": "I moved to Porto", "replaces": lisbon}
        porto = request(server, "POST", "/v1/memory/facts", moved)[1]["id"]
        browser.refresh()
        want = ["I keep bees", "I moved to Porto", "I live in Lisbon"]
        wait(browser, lambda: texts(browser, "#facts .fact .text") == want)
        assert texts(browser, "#facts .fact.replaced .replaced")[0].startswith(
            f"replaced by {porto} on "
        )
        store.delete_facts([porto, lisbon])
        wait(browser, lambda: len(browser.find_elements(By.CSS_SELECTOR, ".message")) == 2)

        # The history: delete the first turn.
        click(browser, ".message.user .delete")
        wait(browser, lambda: [t.role for t in store.turns("default")] == ["assistant"])
        wait(browser, lambda: len(browser.find_elements(By.CSS_SELECTOR, ".message")) == 1)
    assert SCREENSHOT.stat().st_size > 10_000


def test_the_page_opens_on_the_servers_default_conversation(browser):
    engine = FakeEngine(lambda prompt: "Noted.", delay_s=0.01)
    with fake_server(engine, default_conversation="work") as server:
        assert request(server, "GET", "/v1/memory/conversations")[1]["default"] == "work"
        browser.get(server.url + "/")
        wait(browser, lambda: browser.find_element(By.TAG_NAME, "body").get_attribute("data-ready"))
        assert browser.find_element(By.ID, "conversation").get_attribute("value") == "work"
        browser.find_element(By.ID, "input").send_keys("Standup moved to ten")
        browser.find_element(By.ID, "send").click()
        wait(browser, lambda: texts(browser, ".message.assistant .text") == ["Noted."])
        assert [t.text for t in Store().turns("work")] == ["Standup moved to ten", "Noted."]
        assert [c.name for c in Store().conversations()] == ["work"]


def click(browser, css):
    """Click the first element matching `css` in one step on the page: a list may be
    re-rendered between finding an element and clicking it."""
    browser.execute_script("document.querySelector(arguments[0]).click()", css)


def bar_layers(browser) -> list[str]:
    script = "return [...document.querySelectorAll('#context-bar .layer')].map(e => e.className)"
    return [name.split()[1] for name in browser.execute_script(script)]


def test_stop_in_the_page_keeps_the_partial_reply_as_interrupted(browser):
    long_reply = " ".join(f"word{i}" for i in range(120))
    with fake_server(FakeEngine(lambda prompt: long_reply, delay_s=0.05)) as server:
        browser.get(server.url + "/")
        wait(browser, lambda: browser.find_element(By.TAG_NAME, "body").get_attribute("data-ready"))
        browser.find_element(By.ID, "input").send_keys("Tell me a long story")
        browser.find_element(By.ID, "send").click()
        wait(browser, lambda: len(texts(browser, ".message.assistant .text")[0]) > 20)
        browser.find_element(By.ID, "stop").click()
        # The page shows the turn as the log keeps it: cut short, marked interrupted.
        wait(browser, lambda: texts(browser, ".message.assistant .note") == ["interrupted"])
        reply = Store().turns("default")[1]
        assert reply.interrupted and long_reply.startswith(reply.text)
        assert 0 < len(reply.text) < len(long_reply)
        assert texts(browser, ".message.assistant .text") == [reply.text]


def test_deleting_a_fact_lists_the_turns_that_quote_it_and_deletes_them(browser):
    store = Store()
    store.add_fact("I keep bees", source="manual")
    store.append_turn("default", "user", "Guess my hobby")
    store.append_turn("default", "assistant", "You told me: I keep bees. Lovely!")
    store.append_turn("default", "user", "Something else")
    with fake_server(FakeEngine(lambda prompt: "Noted.")) as server:
        browser.get(server.url + "/")
        wait(browser, lambda: browser.find_element(By.TAG_NAME, "body").get_attribute("data-ready"))
        click(browser, "#facts .fact .delete")
        wait(browser, lambda: texts(browser, "#mentions .mention .text"))
        assert texts(browser, "#mentions .mention .text") == ["You told me: I keep bees. Lovely!"]
        assert "still quotes the deleted fact" in texts(browser, "#mentions p")[0]
        assert store.facts() == []
        click(browser, "#mentions .mention .delete")
        wait(
            browser,
            lambda: (
                [t.text for t in store.turns("default")]
                == [
                    "Guess my hobby",
                    "Something else",
                ]
            ),
        )
        wait(browser, lambda: not browser.find_element(By.ID, "mentions").is_displayed())
        assert "Deleted 1 turn" in browser.find_element(By.ID, "status").text


@contextmanager
def framing_site(url):
    """Another site on loopback (another port: another origin) whose page frames `url`."""
    html = f"<iframe id=f src='{url}'></iframe>".encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(html)))
            self.end_headers()
            self.wfile.write(html)

        def log_message(self, *args):
            pass

    site = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{site.server_address[1]}/"
    finally:
        site.shutdown()
        site.server_close()


def test_another_site_cannot_frame_the_page(browser):
    """Clickjacking: a site that frames the page under its own buttons gets an error page in
    the frame, not the page (X-Frame-Options and CSP frame-ancestors)."""
    with fake_server() as server, framing_site(server.url + "/") as framer:
        browser.get(framer)
        frame = browser.find_element(By.ID, "f")
        time.sleep(1.0)  # time for the frame to load, were it allowed to
        browser.switch_to.frame(frame)
        assert browser.find_elements(By.ID, "facts") == []
        browser.switch_to.default_content()
        # The same page opened directly works.
        browser.get(server.url + "/")
        wait(browser, lambda: browser.find_element(By.TAG_NAME, "body").get_attribute("data-ready"))
        assert browser.find_elements(By.ID, "facts")


def test_deleting_a_message_lists_its_reply_and_a_conversation_deletes_on_confirm(browser):
    store = Store()
    store.append_turn("default", "user", "my pin is PINSECRET77")
    store.append_turn("default", "assistant", "Got it: your pin is PINSECRET77.")
    store.append_turn("work", "user", "Standup at ten")
    with fake_server(FakeEngine(lambda prompt: "Noted.")) as server:
        browser.get(server.url + "/")
        wait(browser, lambda: browser.find_element(By.TAG_NAME, "body").get_attribute("data-ready"))
        click(browser, ".message.user .delete")
        wait(browser, lambda: texts(browser, "#mentions .mention .text"))
        assert texts(browser, "#mentions .mention .text") == ["Got it: your pin is PINSECRET77."]
        assert "may still repeat the deleted message" in texts(browser, "#mentions p")[0]
        click(browser, "#mentions .delete-all")
        wait(browser, lambda: store.turns("default") == [])
        wait(browser, lambda: not browser.find_element(By.ID, "mentions").is_displayed())
        # A conversation: the first click asks, the second deletes.
        item = "#conversations li:last-child .delete"
        wait(browser, lambda: "work" in texts(browser, "#conversations .open"))
        click(browser, item)
        assert texts(browser, item) == ["really delete?"]
        click(browser, item)
        wait(browser, lambda: "work" not in [c.name for c in store.conversations()])
