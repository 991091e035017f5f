"""A/B experiments that decide, over fake vLLM backends (depthprune.testing.fake_vllm): shadow scoring by
the control, the comparisons and verdicts in the report, guardrails that act once across replicas, and the
bounds (bad specs refused, drops counted, no series outliving its experiment, strong If-Match).

The fake backends give known answers (depthprune.testing.fake_tokens): an arm served by another model than
the control loses about 1 nat per generated token under it; an A/A arm loses nothing. The real engine's
version of the acceptance is tests/test_experiments_vllm.py.
"""

from __future__ import annotations

import io
import json
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from rich.console import Console

from depthprune.testing.gateways import ADMIN, fake_backends, gateway_replica
from depthprune.testing.servers import wait_until
from server.experiment_report import print_report, report

EXPERIMENT = {
    "arms": [
        {"name": "dense", "variant": "dense", "weight": 1},
        {"name": "dense-aa", "variant": "dense", "weight": 1},
        {"name": "twin", "variant": "twin", "weight": 1},
    ],
    "shadow_rate": 1.0,
}


@pytest.fixture(scope="module")
def backends():
    with fake_backends("dense", "twin") as urls:
        yield urls


def complete(url: str, user: int, *, stream: bool = False, model: str = "ab", **extra) -> httpx.Response:
    body = {"model": model, "prompt": f"the prompt of user {user} says", "max_tokens": 6, "user": f"u{user}"}
    return httpx.post(f"{url}/v1/completions", json={**body, "stream": stream, **extra}, timeout=30)


def scored(url: str, experiment: str = "ab") -> float:
    text = httpx.get(f"{url}/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("depthprune_gateway_shadow_scored_total") and f'experiment="{experiment}"' in line
    )


def test_shadow_scoring_tells_the_arms_apart_and_never_changes_an_answer(backends):
    with gateway_replica(backends, None, experiments={"ab": EXPERIMENT}) as url:
        for user in range(120):
            response = complete(url, user, stream=user % 2 == 1)
            assert response.status_code == 200
            if user % 2 == 0:  # the answer is the one an unsampled request gets
                arm_variant = response.headers["x-depthprune-variant"]
                plain = complete(url, user, model=arm_variant).json()
                assert response.json()["choices"] == plain["choices"]
                assert response.json()["choices"][0]["token_ids"] is None
            else:
                assert 'token_ids":[' not in response.text and 'prompt_token_ids":[' not in response.text
        wait_until(lambda: scored(url) >= 120, 20, "every completion to be scored")
        result = report("ab", [url], registry_url="sqlite:///:memory:")
    assert result["control"] == "dense"
    arms = {arm["name"]: arm for arm in result["arms"]}
    assert "vs_control" not in arms["dense"]
    assert sum(arm["shadow_scored"] for arm in arms.values()) == 120
    twin, twin_aa = arms["twin"]["vs_control"], arms["dense-aa"]["vs_control"]
    assert twin["quality"] == "worse" and twin["nll_delta_cs95"][0] > 0.5
    assert math.isclose(twin["nll_delta"], 1.0, abs_tol=0.15)
    assert twin["agreement_delta"] == pytest.approx(-1.0)
    low, high = twin_aa["nll_delta_cs95"]
    assert low < 0 < high and twin_aa["quality"] == "not_worse"
    assert twin["guardrail"] == {"fired": False}
    for field in ("tpot_ratio", "tpot_ratio_cs95", "e2el_ratio", "e2el_ratio_cs95", "speed"):
        assert field in twin
    console = Console(width=100, record=True, file=io.StringIO())
    print_report(result, console)
    text = console.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 100
    assert "+1.0" in text and "worse" in text  # the twin's delta and verdict, whole


def test_a_full_queue_or_a_control_that_is_down_drops_and_counts_never_fails_a_user(backends):
    with fake_backends("dense-down") as down:
        urls = {**backends, "solo": down["dense-down"]}
        spec = {  # the users all go to twin; solo, the control, only scores
            "arms": [{"variant": "twin"}, {"variant": "solo", "weight": 0}],
            "control": "solo",
            "shadow_rate": 1.0,
        }
        with gateway_replica(urls, None, experiments={"ab": spec}, shadow_queue_size=1) as url:
            statuses = []
            threads = [
                threading.Thread(target=lambda u=u: statuses.append(complete(url, u).status_code))
                for u in range(30)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert statuses == [200] * 30
            text = httpx.get(f"{url}/metrics").text
            assert 'reason="queue_full"' in text or scored(url) == 30
    with gateway_replica(urls, None, experiments={"ab": spec}) as url:  # the control's engine is gone
        assert [complete(url, user).status_code for user in range(5)] == [200] * 5
        wait_until(lambda: 'reason="control_down"' in httpx.get(f"{url}/metrics").text, 10, "a counted drop")


@pytest.mark.parametrize(
    "change, param",
    [
        ({"shadow_rate": 1.5}, "shadow_rate"),
        ({"shadow_rate": -0.1}, "shadow_rate"),
        ({"shadow_rate": "NaN"}, "shadow_rate"),
        ({"control": "nobody"}, None),
        ({"margin": -0.01}, "margin"),
        ({"guardrails": {"max_nll_delta": 0}}, "guardrails.max_nll_delta"),
        ({"guardrails": {"max_nll_delta": -1}}, "guardrails.max_nll_delta"),
        ({"guardrails": {"max_tpot_ratio": "Infinity"}}, "guardrails.max_tpot_ratio"),
        ({"guardrails": {"min_speed": 1}}, "guardrails.min_speed"),
    ],
)
def test_bad_specs_are_refused_and_nothing_is_written(backends, change, param):
    with gateway_replica(backends, None) as url:
        body = json.dumps({**EXPERIMENT, **change}).replace('"NaN"', "NaN").replace('"Infinity"', "Infinity")
        headers = {**ADMIN, "content-type": "application/json"}
        response = httpx.put(f"{url}/admin/experiments/ab", content=body, headers=headers)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_experiment"
        if param is not None:
            assert error["param"] == param
        assert httpx.get(f"{url}/admin/experiments/ab", headers=ADMIN).status_code == 404


def test_an_experiment_without_a_dense_arm_must_name_its_control(backends):
    with gateway_replica(backends, None) as url:
        spec = {"arms": [{"variant": "twin", "name": "a"}, {"variant": "twin", "name": "b"}]}
        refused = httpx.put(f"{url}/admin/experiments/ab", json=spec, headers=ADMIN)
        assert refused.status_code == 400 and "control" in refused.json()["error"]["message"]
        accepted = httpx.put(f"{url}/admin/experiments/ab", json={**spec, "control": "b"}, headers=ADMIN)
        assert accepted.status_code == 200
        arms = {arm["name"]: arm["control"] for arm in accepted.json()["ab"]["arms"]}
        assert arms == {"a": False, "b": True}


def test_a_guardrail_stops_the_arm_once_across_two_replicas(backends, tmp_path):
    registry_url = f"sqlite:///{tmp_path / 'registry.db'}"
    fast = {"guardrail_interval_s": 0.2}
    with (
        gateway_replica(backends, registry_url, experiments={"ab": EXPERIMENT}, **fast) as first,
        gateway_replica(backends, registry_url, **fast) as second,
    ):
        wait_until(lambda: complete(second, 0).status_code == 200, 10, "the second replica to route ab")
        read = httpx.get(f"{first}/admin/experiments/ab", headers=ADMIN)
        guarded = {**read.json()["spec"], "guardrails": {"max_nll_delta": 0.1}}
        put = httpx.put(
            f"{first}/admin/experiments/ab", json=guarded, headers={**ADMIN, "if-match": read.headers["etag"]}
        )
        assert put.status_code == 200

        users = iter(range(10_000, 100_000))

        def twin_stopped() -> bool:
            with ThreadPoolExecutor(8) as pool:  # 30 scored completions a side are needed first
                list(pool.map(lambda url: complete(url, next(users)), [first, second] * 12))
            spec = httpx.get(f"{first}/admin/experiments/ab", headers=ADMIN).json()["spec"]
            return {arm["name"]: arm["weight"] for arm in spec["arms"]}["twin"] == 0

        wait_until(twin_stopped, 240, "the guardrail to stop the twin arm")
        time.sleep(1.0)  # both replicas have seen the limit passed by now; still one change
        history = httpx.get(f"{first}/admin/experiments/ab/history", headers=ADMIN).json()["changes"]
        by_guardrail = [change for change in history if change["actor"] == "guardrail"]
        assert len(by_guardrail) == 1
        assert "nll_delta" in by_guardrail[0]["reason"] and "max_nll_delta 0.1" in by_guardrail[0]["reason"]
        wait_until(lambda: complete(second, 1).status_code == 200 and _synced(second, first), 5, "sync")
        served = {
            complete(url, user).headers["x-depthprune-arm"] for url in (first, second) for user in range(60)
        }
        assert "twin" not in served and served == {"dense", "dense-aa"}
        result = report("ab", [first, second], registry_url=registry_url)
        twin = next(arm for arm in result["arms"] if arm["name"] == "twin")["vs_control"]
        assert twin["guardrail"]["fired"] and twin["guardrail"]["version"] == by_guardrail[0]["version"]
        # an operator re-enables it with an ordinary change: the guardrail judges it on new traffic only
        spec = httpx.get(f"{first}/admin/experiments/ab", headers=ADMIN).json()["spec"]
        for arm in spec["arms"]:
            arm["weight"] = 1
        assert httpx.put(f"{first}/admin/experiments/ab", json=spec, headers=ADMIN).status_code == 200
        time.sleep(1.0)
        spec = httpx.get(f"{first}/admin/experiments/ab", headers=ADMIN).json()["spec"]
        assert {arm["name"]: arm["weight"] for arm in spec["arms"]}["twin"] == 1


def _synced(replica: str, reference: str) -> bool:
    mine = httpx.get(f"{replica}/admin/experiments/ab", headers=ADMIN).headers["etag"]
    return mine == httpx.get(f"{reference}/admin/experiments/ab", headers=ADMIN).headers["etag"]


def test_ten_create_stream_delete_cycles_leave_no_series_behind(backends):
    with gateway_replica(backends, None) as url:
        for cycle in range(10):
            name = f"cycle{cycle}"
            spec = {"arms": [{"variant": "dense"}, {"variant": "twin"}], "shadow_rate": 1.0}
            assert httpx.put(f"{url}/admin/experiments/{name}", json=spec, headers=ADMIN).status_code == 200
            body = {"model": name, "prompt": "w", "max_tokens": 20, "stream": True, "fake_delay": 0.02}
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as stream:
                chunks = stream.iter_bytes()
                next(chunks)  # the stream is under way ...
                assert httpx.delete(f"{url}/admin/experiments/{name}", headers=ADMIN).status_code == 200
                for _ in chunks:  # ... and ends after its experiment is gone
                    pass
        time.sleep(0.5)  # shadow jobs of the deleted experiments finish (dropped)
        text = httpx.get(f"{url}/metrics").text
        assert 'experiment="cycle' not in text


def test_if_match_is_a_strong_comparison_and_may_list_tags(backends):
    with gateway_replica(backends, None) as url:
        spec = {"arms": [{"variant": "dense"}, {"variant": "twin"}]}
        for _ in range(6):
            spec["arms"][1]["weight"] = spec["arms"][1].get("weight", 1) + 1
            assert httpx.put(f"{url}/admin/experiments/ab", json=spec, headers=ADMIN).status_code == 200
        current = httpx.get(f"{url}/admin/experiments/ab", headers=ADMIN).headers["etag"]
        assert current == '"6"'
        spec["arms"][1]["weight"] = 50

        def put(tag: str) -> int:
            headers = {**ADMIN, "if-match": tag}
            return httpx.put(f"{url}/admin/experiments/ab", json=spec, headers=headers).status_code

        assert put('"06"') == 412
        assert put('W/"6"') == 412
        assert put('"5", "7"') == 412
        assert put('"5", "6"') == 200


def test_experiment_names_differing_only_by_case_are_one_name(backends, tmp_path):
    for registry_url in (None, f"sqlite:///{tmp_path / 'registry.db'}"):
        with gateway_replica(backends, registry_url) as url:
            spec = {"arms": [{"variant": "dense"}, {"variant": "twin"}]}
            for reserved in ("Dense", "DENSE"):
                refused = httpx.put(f"{url}/admin/experiments/{reserved}", json=spec, headers=ADMIN)
                assert refused.status_code == 400 and "reserved" in refused.json()["error"]["message"]
            assert httpx.put(f"{url}/admin/experiments/ab", json=spec, headers=ADMIN).status_code == 200
            clash = httpx.put(f"{url}/admin/experiments/AB", json=spec, headers=ADMIN)
            assert clash.status_code == 400 and "only by case" in clash.json()["error"]["message"]
            assert httpx.get(f"{url}/admin/experiments/AB", headers=ADMIN).status_code == 404


def test_a_stream_left_right_after_its_last_event_counts_as_answered_and_is_scored(backends):
    """The openai client closes the connection as soon as it reads ``data: [DONE]``: the answer was whole."""
    with gateway_replica(backends, None, experiments={"ab": EXPERIMENT}) as url:
        for user in range(20):
            body = {"model": "ab", "prompt": f"p {user}", "max_tokens": 4, "stream": True, "user": f"u{user}"}
            body["fake_linger"] = 0.5  # the backend ends its response a moment after [DONE]
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as stream:
                for line in stream.iter_lines():
                    if line == "data: [DONE]":
                        break  # leave at once, as the openai client does
        wait_until(lambda: scored(url) == 20, 10, "every stream to be scored")
        text = httpx.get(f"{url}/metrics").text
        assert 'status="499"' not in text
