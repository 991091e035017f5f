"""End to end, real vLLM CPU engines: ``serve --variants dense --speculative dense-spec=ppl-best:3`` serves
the tiny Llama as ``dense`` and, with a 4-of-6-block pruned variant drafting, as ``dense-spec``. Greedy
completions of ``dense-spec`` equal dense's token for token (dense verifies every drafted token), and the
gateway's ``/metrics`` carries vLLM's drafted and accepted tokens for ``dense-spec``. One gateway, two
engines.

Run: ``.venv/bin/python -m pytest tests/test_speculative_vllm.py -q``
"""

from __future__ import annotations

import httpx
import pytest

from depthprune.testing.servers import running_gateway
from depthprune.testing.variants import registry_with_pruned_variant

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

PROMPTS = ["w5 w6 w7", "w100 w17 w42 w9", "w200", "w33 w33 w33 w33 w33"]
K = 3


@pytest.fixture(scope="module")
def speculative_gateway(tiny_model_dirs, tmp_path_factory):
    """Base URL of ``depthprune serve`` with ``dense`` and ``dense-spec`` (draft: dense less blocks 2, 3)."""
    dense = tiny_model_dirs("llama")
    work = tmp_path_factory.mktemp("speculative-e2e")
    registry_url = registry_with_pruned_variant(dense, work, [2, 3], alias="ppl-best")
    options = [
        "--registry",
        registry_url,
        "--speculative",
        f"dense-spec=ppl-best:{K}",
        "--dtype",
        "float32",
        "--max-model-len",
        "128",
        # vLLM's CPU worker sizes its memory from this fraction too: two engines (one holding two models)
        # beside the test run need less than its default
        "--gpu-memory-utilization",
        "0.25",
        "--vllm-arg=--max-num-seqs=8",
        "--vllm-arg=--enforce-eager",  # compiling two engines took most of the fixture's 3 minutes
        "--start-timeout",
        "600",
        "--log-level",
        "warning",
    ]
    env = {"DEPTHPRUNE_HOME": str(work)}
    with running_gateway("dense", work / "serve.log", *options, env=env, timeout_s=900) as gateway:
        yield gateway.url


def test_speculative_arm_is_lossless_and_reports_acceptance(speculative_gateway):
    url = speculative_gateway
    with httpx.Client(base_url=url, timeout=120) as client:
        cards = {card["id"]: card for card in client.get("/v1/models").json()["data"]}
        assert cards["dense-spec"]["speculative"] == {
            "draft": "ppl-best",
            "num_speculative_tokens": K,
            "target": "dense",
        }
        for prompt in PROMPTS:
            body = dict(prompt=prompt, max_tokens=24, temperature=0, ignore_eos=True, logprobs=0)
            answers = {
                model: client.post("/v1/completions", json={**body, "model": model}).json()["choices"][0]
                for model in ("dense", "dense-spec")
            }
            tokens = {model: answer["logprobs"]["tokens"] for model, answer in answers.items()}
            assert len(tokens["dense"]) == 24 and tokens["dense-spec"] == tokens["dense"], prompt
        metrics = client.get("/metrics").text
    values = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("depthprune_gateway_spec_decode_num_")
        and 'variant="dense-spec"' in line
        and "per_pos" not in line
    }
    drafts = values["depthprune_gateway_spec_decode_num_drafts_total"]
    drafted = values["depthprune_gateway_spec_decode_num_draft_tokens_total"]
    accepted = values["depthprune_gateway_spec_decode_num_accepted_tokens_total"]
    assert drafts > 0 and drafted == K * drafts and 0 <= accepted <= drafted
    assert 'variant="dense"}' not in metrics.split("spec_decode_num_drafts", 1)[1].split("# HELP", 1)[0]
