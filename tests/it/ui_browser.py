"""Drives the operator page (/ui/) in a real, headless Chromium for tests/it/ui.rs.

Usage: ui_browser.py CONFIG_JSON. The config names the viewport (desktop or phone), the login
address `waitpoint ui` printed, where to save the screenshot, the sessions and waitpoints to look
for, and the cortex-signal command to run for the live update. Every wait is bounded; any
failure raises, printing what the page showed, and the exit status is then 1. Prints "ok" last.
"""

import http.server
import json
import re
import subprocess
import sys
import tempfile
import threading
import time

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

# Every wait is bounded by this; the page polls every 500 ms, so a change shows within a second
# on an idle machine, and the bound is only for a loaded CI runner.
PATIENCE_S = 20


def wait_for(what, check, driver):
    """Polls check() until it returns something truthy (a stale element counts as not yet)."""
    end = time.monotonic() + PATIENCE_S
    last_error = None
    while time.monotonic() < end:
        try:
            value = check()
            if value:
                return value
        except StaleElementReferenceException as e:
            last_error = e
        time.sleep(0.05)
    body = driver.execute_script("return document.body.innerText")
    raise AssertionError(f"gave up waiting for {what} ({last_error}); the page shows:\n{body}")


def session_row(driver, session):
    rows = driver.find_elements(By.CSS_SELECTOR, f'li.session[data-session="{session}"]')
    return rows[0] if rows else None


def capsule(driver, session):
    row = session_row(driver, session)
    found = row.find_elements(By.CSS_SELECTOR, ".capsule") if row else []
    return found[0] if found else None


def click_capsule(driver, session):
    """Clicks the session's capsule; the list is redrawn as the view changes, so retry."""
    def clicked():
        c = capsule(driver, session)
        if c is None:
            return False
        c.click()
        return True

    wait_for(f"{session}'s capsule to click", clicked, driver)
    wait_for(
        f"{session}'s panel",
        lambda: driver.find_element(By.ID, "panel").is_displayed()
        and driver.find_element(By.ID, "panel-title").text == session,
        driver,
    )


def open_details(driver):
    """Opens every waitpoint's members and signals in the panel (the list carries none; the
    page asks for them as they open)."""
    def opened():
        closed = driver.find_elements(By.CSS_SELECTOR, "#panel-body section.wp details:not([open]) summary")
        for summary in closed:
            summary.click()
        return driver.find_elements(By.CSS_SELECTOR, "#panel-body section.wp details") and not closed

    wait_for("the members and signals to open", opened, driver)


def panel_text(driver):
    return driver.find_element(By.ID, "panel-body").text


def click_in_panel(driver, waitpoint_id, css):
    def clicked():
        found = driver.find_elements(
            By.CSS_SELECTOR, f'#panel-body section.wp[data-id="{waitpoint_id}"] {css}'
        )
        if not found:
            return False
        found[0].click()
        return True

    wait_for(f"{css} of {waitpoint_id} to click", clicked, driver)


def start(config):
    options = webdriver.ChromeOptions()
    options.binary_location = config["chromium"]
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    width, height = config["size"]
    for arg in (
        "--headless=new",
        # CI runs the tests as root, where Chromium's sandbox cannot start.
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={config['profile']}",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    service = Service(executable_path=config["chromedriver"], log_output=config["driver_log"])
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(PATIENCE_S)
    driver.set_script_timeout(PATIENCE_S)
    # The viewport itself, not the window around it, is what the media query and the sheet see.
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )
    return driver


# A logged-in page lives at its login's place.
PAGE = re.compile(r"/ui/s/[0-9a-f]+/$")


def login(driver, config):
    driver.get(config["login_url"])
    wait_for("the page after logging in", lambda: PAGE.search(driver.current_url), driver)
    config["page"] = driver.current_url
    alice = config["alice"]
    wait_for(
        "alice's capsule",
        lambda: capsule(driver, alice["session"]) is not None,
        driver,
    )
    # Its relative times are as of the list's build, and it says when that was.
    wait_for("the list's time", lambda: "Times as of" in driver.find_element(By.ID, "as-of").text, driver)
    # A marker a reload would lose: every later check shows the page updated in place.
    driver.execute_script("window.notReloaded = true")


class OtherPort(http.server.BaseHTTPRequestHandler):
    """Another local user's server on another port of 127.0.0.1: it keeps the Cookie headers
    it is sent and sets cookies of the page's name on every path it can know of."""

    received = []

    def do_GET(self):
        OtherPort.received.append(self.headers.get("Cookie") or "")
        self.send_response(200)
        for path in ("/", "/ui", "/ui/s", "/ui/s/"):
            self.send_header("Set-Cookie", f"waitpoint_ui=tossed; Path={path}")
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<p>another user's page</p>")

    def log_message(self, *args):
        pass


def other_port(driver, config):
    """The operator's browser visits another port's pages, the page's own paths included: that
    server is never sent the login's cookie, and the cookies it sets end nothing."""
    ours = [c["value"] for c in driver.get_cookies() if c["name"] == "waitpoint_ui"]
    assert ours, driver.get_cookies()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OtherPort)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        other = f"http://127.0.0.1:{server.server_address[1]}"
        for path in ("/ui/api/view", "/ui/s/x/api/view", "/ui/", "/"):
            driver.get(other + path)
            wait_for(f"{path} on the other port", lambda: "another user" in driver.page_source, driver)
    finally:
        server.shutdown()
    assert len(OtherPort.received) >= 4, OtherPort.received
    for sent in OtherPort.received:
        assert not any(value in sent for value in ours), f"the other port was sent the login: {sent}"
    assert any("tossed" in c["value"] for c in driver.get_cookies()), "the other port set its cookies"
    driver.get(config["page"])
    wait_for(
        "the page, still logged in",
        lambda: capsule(driver, config["alice"]["session"]) is not None,
        driver,
    )
    driver.execute_script("window.notReloaded = true")


def not_reloaded(driver):
    assert driver.execute_script("return window.notReloaded === true"), "the page was reloaded"


def check_rings(driver, config):
    alice = config["alice"]
    ring = wait_for(
        "alice's row",
        lambda: (session_row(driver, alice["session"]).find_element(By.CSS_SELECTOR, ".ring").text,),
        driver,
    )[0]
    assert ring == "\u25cb", ring
    def idle_row():
        row = session_row(driver, config["idle"])
        if row is None:
            return None
        capsules = row.find_elements(By.CSS_SELECTOR, ".capsule")
        return (capsules, row.find_element(By.CSS_SELECTOR, ".ring").text, row.text)

    capsules, ring, text = wait_for("the idle session's row", idle_row, driver)
    assert capsules == [], "an idle session has no capsule"
    assert ring == "", text


def check_hostile_text(driver, config):
    hostile = config["hostile"]
    label, intent = hostile["label"], hostile["intent"]
    def label_shown():
        c = capsule(driver, hostile["session"])
        return c is not None and label in c.get_attribute("textContent")

    wait_for("the hostile label shown as text in its capsule", label_shown, driver)
    click_capsule(driver, hostile["session"])
    wait_for("the hostile intent shown as text", lambda: intent in panel_text(driver), driver)
    assert label in panel_text(driver), panel_text(driver)
    assert driver.execute_script("return typeof window.pwned") == "undefined", "page ran injected code"
    assert driver.find_elements(By.CSS_SELECTOR, "img, script:not([src])") == [], "markup got in"
    driver.find_element(By.ID, "panel-close").click()


def check_retry_badge(driver, config):
    """A wake whose delivery is being retried: the badge, with the error on hover."""
    retry = config["retry"]
    click_capsule(driver, retry["session"])
    # The retried hook's attempts keep changing the view, so the list and panel are redrawn
    # meanwhile: each check reads fresh elements and is retried when one went stale.
    def badge_with_error():
        badges = driver.find_elements(By.CSS_SELECTOR, "#panel-body .badge.delivery_retrying")
        return any(
            "delivery retrying" in b.text and retry["error"] in (b.get_attribute("title") or "")
            for b in badges
        )

    wait_for("the retrying badge with its error on hover", badge_with_error, driver)

    def dotted():
        c = capsule(driver, retry["session"])
        return c is not None and "attention" in (c.get_attribute("class") or "")

    wait_for("the attention dot on the retrying session's capsule", dotted, driver)
    driver.find_element(By.ID, "panel-close").click()


def desktop(driver, config):
    alice = config["alice"]
    other_port(driver, config)
    check_rings(driver, config)
    wait_for(
        "alice's capsule text",
        lambda: alice["capsule"] in capsule(driver, alice["session"]).text,
        driver,
    )
    # A signal arrives while the page is open: it shows without a reload.
    subprocess.run(config["signal_command"], check=True, timeout=PATIENCE_S)
    wait_for(
        "the heartbeat on alice's capsule",
        lambda: "heartbeat" in capsule(driver, alice["session"]).text,
        driver,
    )
    not_reloaded(driver)
    click_capsule(driver, alice["session"])
    wait_for("the intent before any detail is asked for", lambda: alice["intent"] in panel_text(driver), driver)
    assert "arm6: no report yet" not in panel_text(driver), "members are shown only when opened"
    open_details(driver)
    for text in [alice["intent"], alice["message"], "arm2", "arm6: no report yet", "quorum 2 of 2"]:
        wait_for(f"{text!r} in the panel", lambda: text in panel_text(driver), driver)
    wait_for(
        "the signal's source in the panel",
        lambda: any(
            s.text.startswith(alice["source_prefix"])
            for s in driver.find_elements(By.CSS_SELECTOR, "#panel-body .signal .meta")
        ),
        driver,
    )
    # A popover by the capsule, not a sheet across the screen. The list is redrawn as the view
    # changes, so both boxes are read together, again if the capsule went stale meanwhile.
    panel, anchor = wait_for(
        "the panel and its capsule's boxes",
        lambda: (driver.find_element(By.ID, "panel").rect, capsule(driver, alice["session"]).rect),
        driver,
    )
    width = driver.execute_script("return document.documentElement.clientWidth")
    assert panel["width"] < width * 0.6, (panel, width)
    assert panel["y"] >= anchor["y"] + anchor["height"], (panel, anchor)
    driver.save_screenshot(config["screenshot"])
    driver.find_element(By.ID, "panel-close").click()
    check_hostile_text(driver, config)
    check_retry_badge(driver, config)
    cancel_flow(driver, config)
    not_reloaded(driver)


def cancel_flow(driver, config):
    bob = config["bob"]
    click_capsule(driver, bob["session"])
    dialog = driver.find_element(By.ID, "confirm")
    # Dismissed: nothing is sent, the waitpoint stays armed.
    click_in_panel(driver, bob["keep"], ".cancel")
    wait_for("the confirmation", lambda: dialog.get_attribute("open") is not None, driver)
    text = dialog.text
    assert "stops the waiting, not the external job" in text and "keeps running" in text, text
    driver.find_element(By.ID, "confirm-no").click()
    wait_for("the confirmation to close", lambda: dialog.get_attribute("open") is None, driver)
    # Confirmed: the waitpoint leaves the panel once the view shows it cancelled.
    click_in_panel(driver, bob["cancel"], ".cancel")
    wait_for("the confirmation", lambda: dialog.get_attribute("open") is not None, driver)
    driver.find_element(By.ID, "confirm-yes").click()
    wait_for(
        "the cancelled waitpoint to leave the panel",
        lambda: not driver.find_elements(
            By.CSS_SELECTOR, f'#panel-body section.wp[data-id="{bob["cancel"]}"]'
        ),
        driver,
    )
    assert driver.find_elements(
        By.CSS_SELECTOR, f'#panel-body section.wp[data-id="{bob["keep"]}"]'
    ), panel_text(driver)


def phone(driver, config):
    alice = config["alice"]
    # The capsule shows the count of armed waitpoints on a phone.
    wait_for(
        "the count on alice's capsule",
        lambda: capsule(driver, alice["session"]).text.strip() == "1",
        driver,
    )
    click_capsule(driver, alice["session"])
    wait_for("the intent in the sheet", lambda: alice["intent"] in panel_text(driver), driver)
    box = driver.execute_script(
        "const r = document.getElementById('panel').getBoundingClientRect();"
        "return [r.left, r.right, r.bottom, innerHeight, document.documentElement.clientWidth];"
    )
    left, right, bottom, height, width = box
    assert abs(bottom - height) < 1 and abs(left) < 1 and abs(right - width) < 1, box
    driver.save_screenshot(config["screenshot"])
    check_hostile_text(driver, config)


def logout(driver, config):
    """The page's Log out button: the login ends, and the page's view answers 401 after it."""
    driver.find_element(By.ID, "logout").click()
    wait_for("the login form", lambda: driver.current_url.endswith("/ui/login"), driver)
    driver.get(config["page"] + "api/view")
    wait_for("the 401 text", lambda: "waitpoint ui" in driver.find_element(By.TAG_NAME, "body").text, driver)


def main():
    config = json.loads(sys.argv[1])
    with tempfile.TemporaryDirectory() as profile:
        config["profile"] = profile
        driver = start(config)
        try:
            login(driver, config)
            {"desktop": desktop, "phone": phone}[config["viewport"]](driver, config)
            # A CSP violation or a script error is SEVERE; the browser's own favicon request
            # (answered 404 outside /ui) is not the page's.
            errors = [
                e
                for e in driver.get_log("browser")
                if e.get("level") == "SEVERE" and "favicon.ico" not in e.get("message", "")
            ]
            assert not errors, errors
            # Last, since the 401 it ends with is logged as a failed load.
            if config["viewport"] == "desktop":
                logout(driver, config)
        finally:
            driver.quit()
    print("ok")


if __name__ == "__main__":
    main()
