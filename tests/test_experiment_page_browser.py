"""The experiment page in a real browser (headless Debian Chromium driven by Selenium,
:mod:`depthprune.testing.browser`), against a gateway over fake vLLM backends: it lists the arms, each chart
draws points with a band, a weight change made through the admin API shows within 2 s, the stop button writes
with ``If-Match`` and a stale version shows its 412 and the new state, and hostile names render as text.

``pytest -k browser`` runs them all; without Chromium they skip and say what to install (``.ci/run`` does).
"""

from __future__ import annotations

import time

import httpx
import pytest

from depthprune.testing.browser import headless_chromium, log_in, missing_browser
from depthprune.testing.gateways import ADMIN, ADMIN_TOKEN, fake_backends
from depthprune.testing.servers import free_port, wait_until

pytestmark = pytest.mark.skipif(missing_browser() is not None, reason=str(missing_browser()))

HOSTILE_ARM = "<img src=x onerror=alert(1)>"
HOSTILE_EXPERIMENT = "<svg onload=alert(2)>"


def experiment(*weights: float) -> dict:
    names = ("dense", "dense-aa", "twin")
    return {
        "arms": [
            {"name": name, "variant": name.removesuffix("-aa"), "weight": w}
            for name, w in zip(names, weights)
        ],
        "shadow_rate": 1.0,
    }


@pytest.fixture(scope="module")
def gateway():
    """A gateway (in memory, sampling every 0.3 s) and its app, over fake backends."""
    from depthprune.testing.fake_vllm import serve_in_thread
    from server import BackendSpec, GatewaySettings, create_app

    with fake_backends("dense", "twin") as backends:
        settings = GatewaySettings(
            backends=[BackendSpec(name, url=url) for name, url in backends.items()],
            admin_token=ADMIN_TOKEN,
            series_interval_s=0.3,
        )
        app = create_app(settings)
        server = serve_in_thread(app, free_port())
        try:
            yield server.url, app
        finally:
            server.stop()


@pytest.fixture(scope="module")
def browser():
    with headless_chromium() as driver:
        yield driver


def put(url: str, name: str, spec: dict, **headers) -> httpx.Response:
    return httpx.put(f"{url}/admin/experiments/{name}", json=spec, headers={**ADMIN, **headers})


def traffic(url: str, name: str, arms: list[str], per_arm: int) -> None:
    """``per_arm`` completions forced to each arm, every other one streamed (TPOT needs streams)."""
    for index in range(per_arm * len(arms)):
        body = {"model": name, "prompt": f"user {index} asks", "max_tokens": 4, "stream": index % 2 == 1}
        headers = {"x-depthprune-arm": arms[index % len(arms)]}
        response = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=30)
        assert response.status_code == 200, response.text


def fresh_login(driver, url: str, path: str) -> None:
    """Log in to ``path`` of the page as a new tab would: nothing in its sessionStorage."""
    driver.get(f"{url}/ui/")
    driver.execute_script("window.sessionStorage.clear()")
    log_in(driver, f"{url}{path}", ADMIN_TOKEN)


def open_page(driver, url: str, name: str) -> None:
    from urllib.parse import quote

    fresh_login(driver, url, f"/ui/experiments/{quote(name, safe='')}")
    wait_until(lambda: driver.execute_script("return document.getElementById('main').dataset.version"), 10)


def shown_version(driver) -> int:
    return int(driver.execute_script("return document.getElementById('main').dataset.version"))


def row_text(driver, arm: str, column: str) -> str:
    return driver.execute_script(
        "const rows = [...document.querySelectorAll('#arms-table tbody tr')];"
        "const row = rows.find(r => r.dataset.arm === arguments[0]);"
        "return row ? row.querySelector(arguments[1]).textContent : null;",
        arm,
        column,
    )


def problems(driver) -> list[str]:
    """The browser's console errors since the last call: script errors and Content-Security-Policy refusals
    (answers such as 401 or 412 are the network's, not problems of the page)."""
    return [
        entry["message"]
        for entry in driver.get_log("browser")
        if (entry["level"] == "SEVERE" and entry["source"] != "network") or "Refused" in entry["message"]
    ]


def test_browser_page_lists_the_arms_and_draws_each_chart_with_its_band(gateway, browser):
    url, _ = gateway
    assert put(url, "charts", experiment(1, 1, 1)).status_code == 200
    traffic(url, "charts", ["dense", "dense-aa", "twin"], per_arm=8)
    open_page(browser, url, "charts")
    assert "token" not in browser.current_url.lower() and ADMIN_TOKEN not in browser.current_url
    assert browser.execute_script("return sessionStorage.getItem('depthprune-ui-token')") == ADMIN_TOKEN

    def drawn() -> dict:
        sections = browser.find_elements("css selector", "section.chart")
        found = {
            s.get_attribute("data-measure"): (s.get_attribute("data-points"), s.get_attribute("data-bands"))
            for s in sections
        }
        ready = len(found) == 4 and all(
            int(points) > 0 and int(bands) == 2 for points, bands in found.values()
        )
        return ready and found

    found = wait_until(drawn, 15, "every chart to draw points and a band per arm")
    assert set(found) == {"nll_delta", "agreement_delta", "tpot_ratio", "e2el_ratio"}
    names = [
        row.get_attribute("data-arm") for row in browser.find_elements("css selector", "#arms-table tbody tr")
    ]
    assert names == ["dense", "dense-aa", "twin"]
    assert row_text(browser, "twin", ".requests") == "8"
    band_pixels = browser.execute_script(
        # the band fill is the arm's colour at alpha 0x33: count such pixels on the NLL chart's canvas
        "const canvas = document.querySelector('#chart-nll_delta canvas');"
        "const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;"
        "let n = 0; for (let i = 3; i < data.length; i += 4) if (data[i] > 30 && data[i] < 90) n++; return n;"
    )
    assert band_pixels > 500
    assert problems(browser) == []


def test_browser_shows_a_weight_change_made_through_the_admin_api_within_2_s(gateway, browser):
    url, _ = gateway
    assert put(url, "weights", experiment(1, 1, 1)).status_code == 200
    open_page(browser, url, "weights")
    assert row_text(browser, "twin", ".weight") == "1.00"
    assert put(url, "weights", experiment(1, 1, 3)).status_code == 200
    changed = time.monotonic()
    wait_until(lambda: row_text(browser, "twin", ".weight") == "3.00", 2.0, "the new weight on the page")
    assert time.monotonic() - changed < 2.0
    assert shown_version(browser) == 2


def click_stop(driver, arm: str) -> None:
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.wait import WebDriverWait

    driver.execute_script(
        "[...document.querySelectorAll('button.stop')].find(b => b.dataset.arm === arguments[0]).click()", arm
    )
    WebDriverWait(driver, 5).until(expected_conditions.alert_is_present()).accept()


def notice(driver) -> str:
    return driver.execute_script(
        "const n = document.getElementById('notice'); return n.hidden ? '' : n.textContent"
    )


def test_browser_stop_button_writes_with_if_match_and_a_stale_version_shows_412(gateway, browser):
    url, _ = gateway
    assert put(url, "stop", experiment(1, 1, 1)).status_code == 200
    open_page(browser, url, "stop")
    assert shown_version(browser) == 1
    # Hold the page at version 1 while someone else changes the experiment: its reads are blocked, so the
    # page still shows version 1 when the button is pressed.
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/ui/api/experiments/stop*"]})
    time.sleep(1.2)  # a poll in flight has landed
    assert put(url, "stop", experiment(1, 2, 1)).status_code == 200
    click_stop(browser, "twin")
    said = wait_until(lambda: "412" in notice(browser) and notice(browser), 5, "the 412 on the page")
    assert "version 1" in said and "version 2" in said and "nothing was changed" in said
    spec = httpx.get(f"{url}/admin/experiments/stop", headers=ADMIN).json()["spec"]
    assert [arm["weight"] for arm in spec["arms"]] == [1, 2, 1]  # the stale write changed nothing
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
    wait_until(lambda: shown_version(browser) == 2, 5, "the page to show the new state")
    assert row_text(browser, "dense-aa", ".weight") == "2.00"

    click_stop(browser, "twin")  # now against the version shown: it is stopped
    wait_until(lambda: "stopped" in notice(browser), 5, "the stop to be confirmed")
    wait_until(lambda: row_text(browser, "twin", ".weight") == "0.00", 5, "the weight 0 on the page")
    history = httpx.get(f"{url}/admin/experiments/stop/history", headers=ADMIN).json()["changes"]
    last = history[-1]
    assert last["version"] == 3 and last["actor"].startswith("ui via gateway")
    assert [arm["weight"] for arm in last["new_spec"]["arms"]] == [1, 2, 0]
    assert browser.find_elements("css selector", "#history-table tbody tr")[0].text.startswith("3")


def test_browser_renders_hostile_names_as_text(gateway, browser):
    """Names the spec checks refuse can still reach a router (code that skips the checks): shown as text."""
    from selenium.common.exceptions import NoAlertPresentException

    from server.protocol import ArmSpec, ExperimentSpec

    url, app = gateway
    checked = ExperimentSpec(arms=[ArmSpec(variant="dense"), ArmSpec(name="placeholder", variant="twin")])
    arms = [checked.arms[0], checked.arms[1].model_copy(update={"name": HOSTILE_ARM})]
    app.state.router.set_experiment(HOSTILE_EXPERIMENT, checked.model_copy(update={"arms": arms}))
    traffic(url, HOSTILE_EXPERIMENT, ["dense", HOSTILE_ARM], per_arm=3)

    fresh_login(browser, url, "/ui/")
    link = wait_until(
        lambda: [
            a for a in browser.find_elements("css selector", "#experiments a") if a.text == HOSTILE_EXPERIMENT
        ],
        10,
        "the hostile experiment in the list",
    )[0]
    assert HOSTILE_ARM in browser.find_element("id", "experiments").text
    link.click()
    wait_until(lambda: row_text(browser, HOSTILE_ARM, ".requests") == "3", 10, "the hostile arm's row")
    assert browser.find_element("id", "experiment-name").text == HOSTILE_EXPERIMENT
    assert HOSTILE_ARM in browser.find_element("id", "arms-table").text
    assert HOSTILE_ARM in browser.find_element("css selector", "#chart-nll_delta .legend").text
    assert browser.find_elements("css selector", "main img, main svg") == []
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018
    assert problems(browser) == []


def test_browser_screenshot_script_runs_on_fake_backends(tmp_path):
    """``python -m benchmarks.ui_screenshots --smoke``: the docs' screenshots' command, in seconds."""
    from benchmarks.ui_screenshots import main

    main(["--smoke", "--shots", "2", "--interval-s", "0.3", "--out", str(tmp_path)])
    shots = sorted(path.name for path in tmp_path.glob("*.png"))
    assert shots == ["experiment-page-2s.png", "experiment-page-guardrail.png"]
    assert all((tmp_path / name).stat().st_size > 20_000 for name in shots)
