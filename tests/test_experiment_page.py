"""The experiment page's server side (server/ui.py, server/experiment_series.py), over fake vLLM backends: who
may read its data, the security headers, the bounded series, replicas' figures added up, and that looking at
the page changes no routing. The page itself, in a real browser: tests/test_experiment_page_browser.py.
"""

from __future__ import annotations

import json
import re
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from depthprune.testing.gateways import ADMIN, fake_backends, gateway_replica
from depthprune.testing.servers import wait_until
from ground.core.errors import UserError
from server.experiment_report import report
from server.experiment_series import FIELDS, Series
from server.ui import ASSETS, CONTENT_SECURITY_POLICY, change_summary

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = {
    "arms": [
        {"name": "dense", "variant": "dense", "weight": 1},
        {"name": "dense-aa", "variant": "dense", "weight": 1},
        {"name": "twin", "variant": "twin", "weight": 1},
    ],
    "shadow_rate": 1.0,
}
FAST = {"series_interval_s": 0.2}
http = httpx.Client(timeout=30)
"""Kept-alive connections: a new one per request costs more than the request on a loaded machine."""


@pytest.fixture(scope="module")
def backends():
    with fake_backends("dense", "twin") as urls:
        yield urls


def send(url: str, count: int, model: str = "ab", first_user: int = 0) -> None:
    """``count`` completions of ``model``, every other one streamed (streams give TPOT)."""
    for user in range(first_user, first_user + count):
        body = {"model": model, "prompt": f"user {user} says", "max_tokens": 4, "user": f"u{user}"}
        response = http.post(f"{url}/v1/completions", json={**body, "stream": user % 2 == 1})
        assert response.status_code == 200


def page_state(url: str, name: str = "ab", headers: dict | None = None, expect: int | None = 200):
    """The page's data of experiment ``name`` (the response itself when ``expect`` is None)."""
    response = http.get(f"{url}/ui/api/experiments/{name}", headers=ADMIN if headers is None else headers)
    if expect is None:
        return response
    assert response.status_code == expect, response.text
    return response.json()


# -- the series -----------------------------------------------------------------------------------------
def figures(value: float, arms=("dense", "twin")) -> dict:
    return {arm: {key: value for key in FIELDS} for arm in arms}


def test_a_series_keeps_at_most_its_points_and_always_spans_the_whole_run():
    series = Series(max_points=8)
    for tick in range(100):
        series.offer(float(tick), figures(tick))
        assert len(series.points) <= 8
    times = [point.time for point in series.points]
    assert times[0] == 0.0 and times[-1] >= 100 - series.stride  # the start is kept, the end is recent
    assert times == sorted(times) and series.stride == 16
    spacing = {round(b - a) for a, b in zip(times, times[1:])}
    assert spacing == {series.stride}  # evenly spread over the run
    seqs = [point.seq for point in series.points]
    assert series.after(seqs[2]) == series.points[3:] and series.after(-1) == series.points
    assert series.points[-1].arm_values()["twin"][FIELDS.index("requests")] == times[-1]


def test_a_point_is_about_190_bytes_plus_60_per_arm():
    """The figures in server/experiment_series.py's docstring (and docs/experiments.md)."""
    for arms, most in ((4, 720 * (200 + 4 * 62)), (16, 720 * (200 + 16 * 62))):
        names = [f"arm-{index}" for index in range(arms)]
        tracemalloc.start()
        series = Series(max_points=720)
        for tick in range(720):
            series.offer(float(tick), figures(0.5, names))
        used, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert len(series.points) == 720
        assert used < most, f"{arms} arms: {used} bytes for 720 points"


def test_a_point_shows_undefined_figures_as_null():
    series = Series(max_points=4)
    series.offer(1.0, {"dense": {"requests": 3}})
    values = series.points[0].json()["arms"]["dense"]
    assert values[0] == 3 and values[FIELDS.index("nll_delta")] is None


# -- who may look --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "keys, token, status",
    [
        ({}, None, 401),  # the admin token is needed ...
        ({}, "admin-secret", 200),
        ({}, "wrong", 401),
        ({"api_key": "key"}, "key", 200),  # ... or the API key where the gateway has one
        ({"api_key": "key"}, "admin-secret", 200),
        ({"api_key": "key"}, None, 401),
        ({"admin_token": None}, None, 200),  # a gateway with neither shows everything to everyone
    ],
)
def test_the_data_needs_the_admin_token_or_the_api_key(backends, keys, token, status):
    with gateway_replica(backends, None, experiments={"ab": EXPERIMENT}, **keys) as url:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        for path in ("/ui/api/experiments", "/ui/api/experiments/ab", "/ui/api/experiments/ab/series"):
            response = http.get(f"{url}{path}", headers=headers)
            assert response.status_code == status, (path, response.text)
        if status == 200:
            admin = page_state(url, headers=headers)["viewer"]["admin"]
            assert admin == (token == "admin-secret")  # only the admin token may stop an arm
        # the page itself carries no data: it is served to anyone, and asks for the token
        page = http.get(f"{url}/ui/experiments/ab")
        assert page.status_code == 200 and "dense-aa" not in page.text and 'id="login"' in page.text


def test_every_ui_response_has_a_policy_without_inline_script(backends):
    with gateway_replica(backends, None, experiments={"ab": EXPERIMENT}) as url:
        paths = ["/ui", "/ui/", "/ui/experiments/ab", *(f"/ui/static/{name}" for name in ASSETS)]
        for path in [*paths, "/ui/api/experiments"]:
            response = http.get(f"{url}{path}", headers=ADMIN)
            assert response.status_code == 200, path
            assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
            assert response.headers["x-content-type-options"] == "nosniff"
        assert "script-src 'self'" in CONTENT_SECURITY_POLICY and "unsafe" not in CONTENT_SECURITY_POLICY
        assert "form-action 'none'" in CONTENT_SECURITY_POLICY
        html = http.get(f"{url}/ui/").text
        scripts = re.findall(r"<script[^>]*>(.*?)</script>", html, re.S)
        assert scripts and all(body.strip() == "" for body in scripts)  # every script is a file
        assert not re.search(r"\son[a-z]+=", html)  # no inline event handler
        assert http.get(f"{url}/ui/static/secrets.py").status_code == 404
        assert http.get(f"{url}/ui/static/..%2Fui.py").status_code == 404
        assert http.get(f"{url}/ui/api/experiments/nothing", headers=ADMIN).status_code == 404


def test_the_charting_library_is_pinned_vendored_and_shipped():
    static = ROOT / "server/static"
    banner = "/*! https://github.com/leeoniya/uPlot (v1.6.32) */"
    assert (static / "uPlot.iife.min.js").read_text().startswith(banner)
    assert "MIT License" in (static / "uPlot.LICENSE").read_text()
    import tomllib

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {path.name for pattern in patterns["server"] for path in (ROOT / "server").glob(pattern)}
    assert {*ASSETS, "page.html", "uPlot.LICENSE"} <= shipped
    script = (static / "page.js").read_text()
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script and "eval(" not in script


# -- figures, history, replicas ------------------------------------------------------------------------
def test_the_page_shows_the_arms_their_figures_and_the_history(backends):
    with gateway_replica(backends, None, experiments={"ab": EXPERIMENT}, **FAST) as url:
        send(url, 60)
        wait_until(lambda: page_state(url)["figures"]["arms"]["twin"]["shadow_scored"] >= 10, 20, "scores")
        spec = page_state(url)["spec"]
        spec["arms"][2]["weight"] = 2
        assert http.put(f"{url}/admin/experiments/ab", json=spec, headers=ADMIN).status_code == 200
        send(url, 20, first_user=100)

        def sampled_after_the_change() -> dict:
            state = page_state(url)
            counted = sum(row["requests"] for row in state["figures"]["arms"].values())
            return state["version"] == 2 and counted == 80 and state

        state = wait_until(sampled_after_the_change, 10, "a sample of every request at version 2")
        assert [arm["name"] for arm in state["arms"]] == ["dense", "dense-aa", "twin"]
        twin = next(arm for arm in state["arms"] if arm["name"] == "twin")
        assert twin["weight"] == 2 and twin["share"] == 0.5 and twin["removed_blocks"] == []
        assert twin["beyond_ideal"] is False and state["arms"][0]["ideal_tpot_ratio"] is None  # the control
        assert state["control"] == "dense" and state["spec"]["arms"][2]["weight"] == 2
        assert [change["what"] for change in state["history"]] == [
            "created with arms dense (1), dense-aa (1), twin (1)",
            "twin weight 1 -> 2",
        ]
        rows = state["figures"]["arms"]
        assert rows["twin"]["vs_control"]["nll_delta"] > 0.5 and "vs_control" not in rows["dense"]
        series = http.get(f"{url}/ui/api/experiments/ab/series", headers=ADMIN).json()
        assert series["fields"] == list(FIELDS) and len(series["points"]) >= 2
        last = series["points"][-1]["seq"]
        later = http.get(f"{url}/ui/api/experiments/ab/series?after={last}", headers=ADMIN).json()
        assert all(point["seq"] > last for point in later["points"])


def test_a_ratio_wholly_below_the_ideal_is_marked_as_the_report_marks_it():
    """8 of 30 blocks removed: the TPOT ratio cannot go below 22/30; an interval wholly below it is flagged
    (the page writes 'an artefact until explained, not a gain'), one reaching it is not."""
    from server.ui import judge_against_ideal

    arms = [
        {"name": "dense", "control": True, "removed_blocks": [], "num_blocks": 30},
        {"name": "pruned", "control": False, "removed_blocks": list(range(8)), "num_blocks": 30},
        {"name": "other", "control": False, "removed_blocks": list(range(8)), "num_blocks": 30},
        {"name": "unknown", "control": False, "removed_blocks": [], "num_blocks": None},
    ]
    figures = {
        "pruned": {"vs_control": {"tpot_ratio_cs95": [0.61, 0.70]}},
        "other": {"vs_control": {"tpot_ratio_cs95": [0.70, 0.74]}},
    }
    judge_against_ideal(arms, figures)
    ideal = {arm["name"]: arm["ideal_tpot_ratio"] for arm in arms}
    assert ideal == {
        "dense": None,
        "pruned": pytest.approx(22 / 30),
        "other": pytest.approx(22 / 30),
        "unknown": None,
    }
    assert [arm["beyond_ideal"] for arm in arms] == [False, True, False, False]
    page = (ROOT / "server/static/page.js").read_text()
    assert "arm.beyond_ideal" in page and "state.shadow_rate > 0" in page


def test_a_gateway_adds_its_peers_figures_as_the_report_does(backends, tmp_path):
    registry_url = f"sqlite:///{tmp_path / 'registry.db'}"
    with gateway_replica(backends, registry_url, experiments={"ab": EXPERIMENT}, **FAST) as second:
        with gateway_replica(backends, registry_url, peers=[second, "http://127.0.0.1:9"], **FAST) as first:
            wait_until(lambda: page_state(first, "ab", ADMIN, expect=None).status_code == 200, 10)
            send(first, 30)
            send(second, 20, first_user=30)
            wait_until(lambda: http.get(f"{second}/metrics").text.count("shadow_scored_total{") >= 3, 10)
            expected = {arm["name"]: arm["requests"] for arm in report("ab", [first, second])["arms"]}
            assert sum(expected.values()) == 50

            def combined():
                state = page_state(first)
                counts = {name: row["requests"] for name, row in state["figures"]["arms"].items()}
                return counts == expected and state

            state = wait_until(combined, 10, "the first replica's page to add the second's figures")
            assert state["peers"][second] is None and "ConnectError" in state["peers"]["http://127.0.0.1:9"]
            own = page_state(second)["figures"]["arms"]  # the second has no peers: its own traffic only
            assert sum(row["requests"] for row in own.values()) == 20


def test_looking_at_the_page_changes_no_routing_and_no_metric(backends):
    unscored = {**EXPERIMENT, "sticky": True, "shadow_rate": 0.0}  # no scores land while it looks
    with gateway_replica(backends, None, experiments={"ab": unscored}, **FAST) as url:

        def arms() -> list[str]:
            body = {"model": "ab", "prompt": "w", "max_tokens": 1}
            answers = [http.post(f"{url}/v1/completions", json={**body, "user": f"u{u}"}) for u in range(30)]
            return [answer.headers["x-depthprune-arm"] for answer in answers]

        def v1_lines() -> list[str]:
            text = http.get(f"{url}/metrics").text
            return sorted(
                line for line in text.splitlines() if re.search(r"requests_total\{|arm_moments", line)
            )

        before, lines = arms(), v1_lines()
        for _ in range(15):
            for path in ("", "/ab", "/ab/series"):
                assert http.get(f"{url}/ui/api/experiments{path}", headers=ADMIN).status_code == 200
            http.get(f"{url}/ui/experiments/ab")
        assert v1_lines() == lines  # the page's requests are not counted as traffic of any arm
        assert arms() == before and page_state(url)["version"] == 1


def test_a_deleted_experiment_takes_its_series_with_it(backends):
    with gateway_replica(backends, None, experiments={"ab": EXPERIMENT}, **FAST) as url:
        send(url, 4)
        series = f"{url}/ui/api/experiments/ab/series"
        wait_until(lambda: http.get(series, headers=ADMIN).json()["points"], 10)
        assert http.delete(f"{url}/admin/experiments/ab", headers=ADMIN).status_code == 200
        wait_until(lambda: http.get(series, headers=ADMIN).status_code == 404, 10, "the series to go")
        assert http.get(f"{url}/ui/api/experiments", headers=ADMIN).json()["experiments"] == []


def test_a_change_is_summarised_in_words():
    old = {"arms": [{"name": "a", "weight": 1.0}, {"name": "b", "weight": 1.0}], "margin": 0.05}
    new = {"arms": [{"name": "a", "weight": 0.0}, {"name": "c", "weight": 2.5}], "margin": 0.1}
    said = "a weight 1 -> 0; arm c added (weight 2.5); arm b removed; margin 0.05 -> 0.1"
    assert change_summary(old, new) == said
    assert change_summary(old, None) == "deleted"
    assert change_summary(None, old) == "created with arms a (1), b (1)"
    assert change_summary(old, json.loads(json.dumps(old))) == "no change"


# -- settings and the command line -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "field, value, message",
    [
        ("peers", ["gw-2:8000"], "peers"),
        ("series_interval_s", 0, "series_interval_s"),
        ("series_points", 1, "series_points"),
    ],
)
def test_bad_page_settings_are_refused(field, value, message):
    from server import BackendSpec, GatewaySettings

    with pytest.raises(UserError, match=message):
        GatewaySettings(backends=[BackendSpec("dense", url="http://127.0.0.1:1")], **{field: value})


def test_serve_prints_the_page_beside_the_gateway(capsys):
    from server.cli import print_ready

    summary = {"url": "http://127.0.0.1:8000", "variants": {}, "experiments": []}
    print_ready(summary, SimpleNamespace(backends={}), as_json=False)
    lines = capsys.readouterr().err.splitlines()
    assert lines[-2].startswith("gateway listening on http://127.0.0.1:8000")
    assert lines[-1].startswith("experiments page at http://127.0.0.1:8000/ui/")
    print_ready(summary, SimpleNamespace(backends={}), as_json=True)
    assert json.loads(capsys.readouterr().out)["ui"] == "http://127.0.0.1:8000/ui/"
