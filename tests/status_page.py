#!/usr/bin/env python3
"""Drives a headless Chromium through the admin status page.

Usage: python3 tests/status_page.py ADMIN_URL TOKEN_FILE LIMIT_NAME SCREENSHOT_PATH

Logs in with the admin token, waits until LIMIT_NAME's chart plots live
admitted and refused traffic, checks the page's other sections and saves a
screenshot. Silent with exit 0 on success; on failure one line on stderr
(followed by the page's visible text) and exit 1.
"""

import os
import shutil
import sys
import tempfile

from selenium import webdriver
from selenium.common.exceptions import TimeoutException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
DEADLINE_S = 20
PAGE_TEXT_MAX = 2000

# The page re-renders every few seconds, so state is read in one script call
# rather than through element handles that may go stale in between.
CHART_STATE_JS = """
const name = arguments[0];
for (const svg of document.querySelectorAll("svg.chart")) {
  if (svg.getAttribute("data-limit") === name) {
    return {admitted: svg.getAttribute("data-admitted"), refused: svg.getAttribute("data-refused")};
  }
}
return null;
"""

PAGE_STATE_JS = """
const visible = (e) => !!(e.offsetWidth || e.offsetHeight || e.getClientRects().length)
  && getComputedStyle(e).visibility !== "hidden";
const store = document.getElementById("store-state");
return {
  store: store ? store.textContent.trim() : null,
  rows: Array.from(document.querySelectorAll("#top-refused tbody tr"), (tr) => tr.textContent),
  reloads: !!document.getElementById("reloads"),
  connections: !!document.getElementById("connections"),
  errors: Array.from(document.querySelectorAll(".error")).filter(visible).map((e) => e.textContent.trim()),
};
"""


class Failure(Exception):
    pass


def number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def start_chrome(profile):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1000",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(arg)
    # An explicit driver path keeps Selenium Manager (which downloads) out of it.
    service = Service(executable_path=CHROMEDRIVER)
    try:
        driver = webdriver.Chrome(service=service, options=options)
    except WebDriverException as e:
        raise Failure(f"could not start Chromium ({CHROMIUM}) through {CHROMEDRIVER}: {e.msg or e}")
    try:
        # Headless Chromium keeps room for browser chrome inside the window size;
        # pin the page's viewport itself to 1400x1000 for the screenshot.
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1400, "height": 1000, "deviceScaleFactor": 1, "mobile": False},
        )
        driver.execute_cdp_cmd("Emulation.setScrollbarsHidden", {"hidden": True})
        driver.set_page_load_timeout(DEADLINE_S)
        driver.set_script_timeout(DEADLINE_S)
    except WebDriverException:
        driver.quit()
        raise
    return driver


def wait(driver, condition, message):
    """Waits up to DEADLINE_S for condition(driver) to be truthy, else fails with message()."""
    try:
        return WebDriverWait(driver, DEADLINE_S, poll_frequency=0.25).until(condition)
    except TimeoutException:
        raise Failure(message())


def log_in(driver, admin_url, token):
    url = admin_url + "/"
    try:
        driver.get(url)
    except WebDriverException as e:
        raise Failure(f"could not open {url}: {e.msg or e}")

    def login_form(d):
        # Chromium answers an unreachable server with its own error page, not an exception.
        if d.execute_script("return document.URL").startswith("chrome-error:"):
            raise Failure(f"could not reach {url}")
        return d.find_elements(By.ID, "token") and d.find_elements(By.ID, "login")

    wait(
        driver,
        login_form,
        lambda: f"{url} did not serve the login page (#token and #login) within {DEADLINE_S} s",
    )
    field = driver.find_element(By.ID, "token")
    field.clear()
    field.send_keys(token)
    driver.find_element(By.ID, "login").click()
    wait(
        driver,
        EC.staleness_of(field),
        lambda: f"submitting the login form did not leave the login page within {DEADLINE_S} s",
    )
    # Whatever markup the server uses for its error, a refused login serves the form again.
    page = wait(
        driver,
        lambda d: ("status" if d.find_elements(By.ID, "store-state") else None)
        or ("login" if d.find_elements(By.ID, "token") else None),
        lambda: f"after logging in, the status page (#store-state) did not load within {DEADLINE_S} s "
        f"(at {driver.current_url})",
    )
    if page == "login":
        raise Failure("the login with the token from the token file was refused (the login page came back)")

    cookies = driver.get_cookies()
    if not cookies:
        raise Failure("logged in, but the server set no session cookie")
    readable = [c["name"] for c in cookies if not c.get("httpOnly")]
    if readable:
        raise Failure(f"the session cookie is readable by scripts (not HttpOnly): {', '.join(readable)}")


def wait_for_chart(driver, limit):
    last = {"state": None}

    def plotted(d):
        state = d.execute_script(CHART_STATE_JS, limit)
        last["state"] = state
        return bool(state) and number(state["admitted"]) > 0 and number(state["refused"]) > 0

    def why():
        state = last["state"]
        if not state:
            message = f'no chart svg.chart[data-limit="{limit}"] appeared within {DEADLINE_S} s'
        else:
            message = (
                f'the chart for "{limit}" did not plot both admitted and refused traffic within {DEADLINE_S} s '
                f"(last seen: data-admitted={state['admitted']!r}, data-refused={state['refused']!r})"
            )
        try:
            shown = driver.execute_script(PAGE_STATE_JS)["errors"]
        except WebDriverException:
            shown = []
        return message + (f"; the page shows: {' | '.join(shown)}" if shown else "")

    wait(driver, plotted, why)


def check_page(driver, limit):
    state = driver.execute_script(PAGE_STATE_JS)
    if not state["store"]:
        raise Failure("#store-state is missing or empty")
    if not state["rows"]:
        raise Failure("#top-refused has no rows in its tbody")
    if not any(limit in row for row in state["rows"]):
        raise Failure(f'no row of #top-refused mentions the limit "{limit}"')
    if not state["reloads"]:
        raise Failure("#reloads is missing")
    if not state["connections"]:
        raise Failure("#connections is missing")
    if state["errors"]:
        raise Failure(f"the page shows an error: {' | '.join(state['errors'])}")


def page_text(driver):
    try:
        text = driver.find_element(By.TAG_NAME, "body").text
    except WebDriverException:
        return ""
    text = text.strip()
    return text[:PAGE_TEXT_MAX] + ("…" if len(text) > PAGE_TEXT_MAX else "")


def main(argv):
    if len(argv) != 5:
        print("usage: status_page.py ADMIN_URL TOKEN_FILE LIMIT_NAME SCREENSHOT_PATH", file=sys.stderr)
        return 1
    admin_url, token_file, limit, screenshot = argv[1].rstrip("/"), argv[2], argv[3], argv[4]
    try:
        with open(token_file, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as e:
        print(f"cannot read the token file {token_file}: {e.strerror}", file=sys.stderr)
        return 1
    if not token:
        print(f"the token file {token_file} is empty", file=sys.stderr)
        return 1

    profile = tempfile.mkdtemp(prefix="floodgate-chromium-")
    driver = None
    try:
        driver = start_chrome(profile)
        log_in(driver, admin_url, token)
        wait_for_chart(driver, limit)
        check_page(driver, limit)
        png = driver.get_screenshot_as_png()
        try:
            os.makedirs(os.path.dirname(os.path.abspath(screenshot)), exist_ok=True)
            with open(screenshot, "wb") as f:
                f.write(png)
        except OSError as e:
            raise Failure(f"could not save the screenshot to {screenshot}: {e.strerror}")
        return 0
    except (Failure, WebDriverException) as e:
        message = f"the browser failed: {e.msg or e}" if isinstance(e, WebDriverException) else str(e)
        print(" ".join(message.split()), file=sys.stderr)
        if driver is not None:
            text = page_text(driver)
            if text:
                print(f"--- visible page text ---\n{text}", file=sys.stderr)
        return 1
    finally:
        if driver is not None:
            try:
                driver.quit()
            except WebDriverException:
                pass
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
