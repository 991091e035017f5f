"""End to end: ``depthprune serve`` with the real vLLM CPU engine serving a dense tiny Llama and a pruned
variant of it (``pruning.model.checkpoint.write_pruned_checkpoint``), both resolved from a registry, called
through the official ``openai`` client, streaming included; and ``--speculative dense-spec=ppl-best:3``: dense
with the 4-of-6-block variant drafting, whose greedy completions equal dense's token for token (dense verifies
every drafted token) and whose drafted and accepted tokens reach the gateway's ``/metrics``. One gateway for
the session, three engine starts (the speculative test had its own gateway and two more before).

Run: ``.venv/bin/python -m pytest tests/test_server_vllm.py -q``
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from depthprune.testing.servers import running_gateway
from depthprune.testing.variants import registry_with_pruned_variant

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
MAX_MODEL_LEN = 128
K = 3
"""Tokens ``dense-spec``'s draft proposes per step."""
PROMPTS = ["w5 w6 w7", "w100 w17 w42 w9", "w200", "w33 w33 w33 w33 w33"]
EXACT = {"ignore_eos": True}  # exactly max_tokens tokens, whatever the random model says


@pytest.fixture(scope="session")
def served_gateway(tiny_model_dirs, tmp_path_factory):
    """``(base URL, startup summary)`` of ``depthprune serve`` over a registry with dense and ppl-best."""
    dense = tiny_model_dirs("llama")
    work = tmp_path_factory.mktemp("gateway-e2e")
    registry_url = registry_with_pruned_variant(dense, work, [2, 3], alias="ppl-best")
    (work / "chat.jinja").write_text(CHAT_TEMPLATE)
    config = work / "gateway.json"
    config.write_text(
        json.dumps(
            {
                "experiments": {
                    "llama-ab": {
                        "arms": [
                            {"name": "pruned", "objective": "ppl", "weight": 1, "fallback": "dense"},
                            {"name": "control", "variant": "dense", "weight": 1},
                        ]
                    }
                }
            }
        )
    )
    options = [
        "--registry",
        registry_url,
        "--config",
        str(config),
        "--dtype",
        "float32",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        f"--vllm-arg=--chat-template={work / 'chat.jinja'}",
        "--speculative",
        f"dense-spec=ppl-best:{K}",
        # vLLM's CPU worker sizes its memory from this fraction too: three engines (one holding two models)
        # beside the test run need less than its default
        "--gpu-memory-utilization",
        "0.25",
        "--vllm-arg=--max-num-seqs=8",
        "--vllm-arg=--enforce-eager",
        "--start-timeout",
        "600",
        "--log-level",
        "warning",
    ]
    env = {"DEPTHPRUNE_HOME": str(work)}
    with running_gateway("dense,ppl-best", work / "serve.log", *options, env=env, timeout_s=600) as gateway:
        yield gateway.url, gateway.summary


@pytest.fixture()
def client(served_gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served_gateway[0]}/v1", api_key="unused", max_retries=0, timeout=120)


def test_models_show_the_registry_facts(client, served_gateway):
    _, summary = served_gateway
    assert set(summary["variants"]) == {"dense", "ppl-best", "dense-spec"}
    assert all(state["up"] and state["managed"] for state in summary["variants"].values())
    cards = {card.id: card.model_dump() for card in client.models.list()}
    assert set(cards) == {"dense", "ppl-best", "dense-spec", "llama-ab"}
    assert cards["ppl-best"]["removed_blocks"] == [2, 3] and cards["ppl-best"]["objective"] == "perplexity"
    assert cards["ppl-best"]["max_model_len"] == MAX_MODEL_LEN and cards["ppl-best"]["num_blocks"] == 6
    assert (
        cards["dense"]["removed_blocks"] == []
        and cards["dense"]["base_model"] == cards["ppl-best"]["base_model"]
    )
    assert cards["llama-ab"]["arms"][0]["variant"] == "ppl-best"
    assert cards["dense"]["max_model_len"] == MAX_MODEL_LEN


def test_completions_through_the_openai_client(client):
    raw = client.completions.with_raw_response.create(
        model="ppl-best", prompt="w5 w6 w7", max_tokens=6, temperature=0, extra_body=EXACT
    )
    completion = raw.parse()
    assert raw.headers["x-depthprune-variant"] == "ppl-best"
    assert completion.usage.completion_tokens == 6 and completion.choices[0].text
    stream = client.completions.create(
        model="dense", prompt="w5 w6 w7", max_tokens=6, temperature=0, stream=True
    )
    chunks = list(stream)
    assert sum(1 for chunk in chunks if chunk.choices and chunk.choices[0].text) >= 1
    assert all(chunk.usage is None for chunk in chunks)
    dense_text = client.completions.create(model="dense", prompt="w5 w6 w7", max_tokens=6, temperature=0)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == dense_text.choices[0].text


def test_chat_streaming_on_an_experiment(client):
    messages = [{"role": "user", "content": "w9 w10"}]
    arms = {}
    for user in ("alice", "bob", "carol", "dave", "erin", "frank"):
        raw = client.chat.completions.with_raw_response.create(
            model="llama-ab",
            messages=messages,
            max_tokens=4,
            extra_body=EXACT,
            user=user,
            stream=True,
            stream_options={"include_usage": True},
        )
        assert raw.headers["x-depthprune-experiment"] == "llama-ab"
        chunks = list(raw.parse())
        assert chunks[-1].usage.completion_tokens == 4
        arms[user] = (raw.headers["x-depthprune-arm"], raw.headers["x-depthprune-variant"])
    assert set(arms.values()) <= {("pruned", "ppl-best"), ("control", "dense")}
    again = client.chat.completions.with_raw_response.create(
        model="llama-ab", messages=messages, max_tokens=2, user="alice"
    )
    assert (again.headers["x-depthprune-arm"], again.headers["x-depthprune-variant"]) == arms["alice"]


def test_errors_and_metrics_with_the_real_engine(client, served_gateway):
    url = served_gateway[0]
    with pytest.raises(openai.BadRequestError, match="context length"):
        client.completions.create(model="dense", prompt="w5", max_tokens=MAX_MODEL_LEN + 1)
    with pytest.raises(openai.BadRequestError, match="context length"):  # vLLM's own check: prompt too long
        client.completions.create(model="dense", prompt="w5 " * 200, max_tokens=4)
    before = gateway_samples(url)
    client.completions.create(model="ppl-best", prompt="w5 w6", max_tokens=5, temperature=0, extra_body=EXACT)
    list(
        client.completions.create(
            model="dense", prompt="w5 w6 w7", max_tokens=3, stream=True, extra_body=EXACT
        )
    )
    after = gateway_samples(url)

    def delta(name, variant):
        key = (name, (("arm", ""), ("experiment", ""), ("variant", variant)))
        return after.get(key, 0.0) - before.get(key, 0.0)

    # Token counts come from vLLM's usage, also for the stream (the gateway asks for it and hides it).
    assert delta("depthprune_gateway_generation_tokens_total", "ppl-best") == 5
    assert delta("depthprune_gateway_prompt_tokens_total", "dense") >= 3
    assert delta("depthprune_gateway_generation_tokens_total", "dense") == 3
    assert delta("depthprune_gateway_time_to_first_token_seconds_count", "dense") == 1
    backend = httpx.get(f"{url}/metrics/backends/ppl-best").text
    assert "vllm:generation_tokens_total" in backend


def gateway_samples(url: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_speculative_arm_is_lossless_and_reports_acceptance(served_gateway):
    url = served_gateway[0]
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
