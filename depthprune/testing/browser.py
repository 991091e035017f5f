"""Headless Chromium for the browser tests: Debian's chromium and chromium-driver, driven by Selenium::

    with headless_chromium() as driver:
        log_in(driver, f"{gateway}/ui/", ADMIN_TOKEN)

Nothing is downloaded: Selenium is pointed at the system's browser and driver (Debian builds both from one
source, so their versions match). ``.ci/run`` installs them where absent (``apt-get install chromium
chromium-driver``); elsewhere :func:`missing_browser` says what is missing and the tests skip with it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def missing_browser() -> str | None:
    """Why the browser tests cannot run here (None when they can)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (make install installs the dev extra)"
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not Path(path).exists() and shutil.which(Path(path).name) is None:
            return f"{path} is missing: apt-get install -y chromium chromium-driver (.ci/run does)"
    return None


@contextmanager
def headless_chromium(width: int = 1400, height: int = 1100) -> Iterator:
    """A headless Chromium window of ``width`` x ``height`` CSS pixels, closed when the block ends.

    The browser's console is kept (``driver.get_log("browser")``), so a test can see a Content-Security-Policy
    violation or a script error.
    """
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root in a container: the sandbox needs user namespaces it may not have
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        f"--window-size={width},{height}",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver_path = CHROMEDRIVER if Path(CHROMEDRIVER).exists() else shutil.which("chromedriver")
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    try:
        yield driver
    finally:
        driver.quit()


def log_in(driver, url: str, token: str, timeout_s: float = 10.0) -> None:
    """Open ``url`` (a page of ``/ui/``) and type ``token`` into its login form."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.wait import WebDriverWait

    driver.get(url)
    field = WebDriverWait(driver, timeout_s).until(
        expected_conditions.visibility_of_element_located((By.ID, "token"))
    )
    field.send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
