"""Issue 53's acceptance on the real model and the real vLLM CPU engine: an experiment that decides.

SmolLM2-135M (the embedded model) served as ``dense`` and as a variant without 8 of its 30 blocks, behind
``depthprune serve``; the experiment has the control ``dense``, an A/A arm (dense under another name) and the
variant, every completion shadow-scored by dense. 120 sampled (temperature 1) streamed requests through the
official ``openai`` client (users 0-119: 40, 41 and 39 of them on the three arms, by the sticky hash), the
report read four times on the way: every request answered 200, the variant
``worse`` with its ``nll_delta`` sequence above 0, the A/A arm's sequence holding 0 and the A/A arm never
``worse``, ``faster`` or ``slower`` at any look. Then a guardrail added by PUT stops the variant: weight 0,
one change by ``guardrail``, no later request answered by it.

Run: ``.venv/bin/python -m pytest tests/test_experiments_vllm.py -q -s`` (about 5 minutes on 2 cores,
3 of them starting the two engines).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from depthprune.testing.servers import running_gateway, wait_until
from depthprune.testing.variants import registry_with_pruned_variant
from server.experiment_report import report

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

REMOVED = [3, 6, 9, 12, 15, 18, 21, 24]  # 8 of 30 blocks, spread over the depth
REQUESTS, LOOKS = 120, 4  # the variant is `worse` from the first look allowed to decide (30 scored)
ADMIN = {"authorization": "Bearer admin-secret"}
PROMPTS = [
    "Write one sentence about the sea:",
    "The recipe for bread starts with",
    "In the morning the village market",
    "A short note to a friend about the weather:",
    "The history of the bicycle begins",
    "Three things to pack for a hike are",
]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    from pruning.model.sources import resolve_model

    dense = Path(resolve_model("smollm2-135m").model)
    work = tmp_path_factory.mktemp("experiments-vllm")
    registry_url = registry_with_pruned_variant(dense, work, REMOVED, alias="ppl-best")
    experiment = {
        "arms": [
            {"name": "dense", "variant": "dense", "weight": 1},
            {"name": "dense-aa", "variant": "dense", "weight": 1},
            {"name": "pruned", "variant": "ppl-best", "weight": 1},
        ],
        "shadow_rate": 1.0,
    }
    config = work / "gateway.json"
    config.write_text(json.dumps({"experiments": {"ab": experiment}}))
    options = [
        "--registry",
        registry_url,
        "--config",
        str(config),
        "--admin-token",
        "admin-secret",
        "--dtype",
        "float32",
        "--max-model-len",
        "256",
        "--vllm-arg=--max-num-seqs=8",
        "--vllm-arg=--enforce-eager",
        "--start-timeout",
        "600",
        "--log-level",
        "warning",
    ]
    env = {"DEPTHPRUNE_HOME": str(work), "VLLM_CPU_KVCACHE_SPACE": "1"}
    with running_gateway("dense,ppl-best", work / "serve.log", *options, env=env, timeout_s=900) as running:
        yield running.url, registry_url


def ask(client: openai.OpenAI, user: int) -> tuple[str, int]:
    """One sampled streamed completion; (arm, HTTP status)."""
    stream = client.completions.with_raw_response.create(
        model="ab",
        prompt=PROMPTS[user % len(PROMPTS)],
        max_tokens=16,
        temperature=1.0,
        stream=True,
        user=f"user-{user}",
    )
    for _ in stream.parse():
        pass
    return stream.headers["x-depthprune-arm"], stream.status_code


def _accounted(url: str) -> int:
    """Completions scored or dropped so far."""
    arms = report("ab", [url])["arms"]
    return sum(arm["shadow_scored"] + arm["shadow_dropped"] for arm in arms)


def _verdicts(result: dict) -> dict:
    shown = {}
    for arm in result["arms"]:
        versus = arm.get("vs_control") or {}
        shown[arm["name"]] = (arm["shadow_scored"], versus.get("nll_delta_cs95"), versus.get("quality"))
        shown[arm["name"]] += (versus.get("tpot_ratio_cs95"), versus.get("speed"))
    return shown


def test_the_experiment_decides_and_its_guardrail_acts(gateway):
    url, registry_url = gateway
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
    answered, looks = [], []
    with ThreadPoolExecutor(4) as pool:
        for look in range(LOOKS):
            users = range(look * REQUESTS // LOOKS, (look + 1) * REQUESTS // LOOKS)
            answered += list(pool.map(lambda user: ask(client, user), users))
            wait_until(lambda: _accounted(url) >= len(answered), 300, "the shadow scores to catch up")
            looks.append(report("ab", [url], registry_url=registry_url))
            print(f"look {look + 1}: {_verdicts(looks[-1])}", flush=True)
    assert [status for _, status in answered] == [200] * REQUESTS
    for result in looks:
        arms = {arm["name"]: arm for arm in result["arms"]}
        twin = arms["dense-aa"]["vs_control"]
        assert twin["quality"] != "worse" and twin["speed"] == "undecided"
    final = {arm["name"]: arm for arm in looks[-1]["arms"]}
    assert looks[-1]["control"] == "dense"
    pruned, twin = final["pruned"]["vs_control"], final["dense-aa"]["vs_control"]
    assert pruned["quality"] == "worse" and pruned["nll_delta_cs95"][0] > 0
    assert twin["nll_delta_cs95"][0] <= 0 <= twin["nll_delta_cs95"][1]

    read = httpx.get(f"{url}/admin/experiments/ab", headers=ADMIN)
    guarded = {**read.json()["spec"], "guardrails": {"max_nll_delta": 0.1}}
    headers = {**ADMIN, "if-match": read.headers["etag"]}
    assert httpx.put(f"{url}/admin/experiments/ab", json=guarded, headers=headers).status_code == 200

    # the evidence so far already passes the limit: the guardrail acts within seconds
    def weights() -> dict:
        arms = httpx.get(f"{url}/admin/experiments/ab", headers=ADMIN).json()["arms"]
        return {arm["name"]: arm["weight"] for arm in arms}

    wait_until(lambda: weights()["pruned"] == 0, 30, "the guardrail to stop the pruned arm")
    history = httpx.get(f"{url}/admin/experiments/ab/history", headers=ADMIN).json()["changes"]
    assert [change["actor"] for change in history].count("guardrail") == 1
    with ThreadPoolExecutor(4) as pool:
        later = list(pool.map(lambda user: ask(client, user), range(1000, 1020)))
    assert {arm for arm, _ in later} <= {"dense", "dense-aa"} and {s for _, s in later} == {200}
