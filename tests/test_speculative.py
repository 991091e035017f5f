"""``serve --speculative NAME=DRAFT[:K]`` without an engine: parsing, the one-line refusals of a draft of
another base or vocabulary (or K < 1) before anything starts, the vLLM command line, the memory plan counting
the draft, and the acceptance counters read from vLLM's ``/metrics`` text.

Run: ``.venv/bin/python -m pytest tests/test_speculative.py -q``
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from depthprune.testing.variants import register_example_base, register_example_variant
from ground.core.checksums import weights_sha256
from ground.core.errors import UserError
from server.backends import Backend
from server.cli import build_settings
from server.metrics import GatewayMetrics, spec_decode_counts
from server.settings import VllmOptions
from server.speculative import DEFAULT_NUM_SPECULATIVE_TOKENS, MAX_NUM_SPECULATIVE_TOKENS, parse_speculative

CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "num_hidden_layers": 6,
    "vocab_size": 256,
    "max_position_embeddings": 256,
}


def checkpoint(directory: Path, weights: bytes, **config) -> Path:
    """A directory with config.json, weights and a tokenizer file (no torch needed)."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({**CONFIG, **config}))
    (directory / "model.safetensors").write_bytes(weights)
    (directory / "tokenizer.json").write_text('{"model": {"vocab": {"w4": 4}}}')
    return directory


def draft_of(directory: Path, dense: Path, base_sha: str | None = None, **config) -> Path:
    """A pruned draft of ``dense`` (4 of 6 blocks) as ``prune`` writes it, as far as the checks look."""
    checkpoint(directory, b"draft weights", num_hidden_layers=4, **config)
    shutil_copy(dense / "tokenizer.json", directory / "tokenizer.json")
    pruning = {"base_model": str(dense), "base_weights_sha256": base_sha or weights_sha256(dense)}
    (directory / "pruning.json").write_text(json.dumps(pruning))
    return directory


def shutil_copy(source: Path, target: Path) -> None:
    target.write_bytes(source.read_bytes())


@pytest.fixture()
def served(tmp_path):
    """``(registry URL, dense dir, draft dir)``: dense registered, and a registered draft ``ppl-best``."""
    from registry import open_registry

    dense = checkpoint(tmp_path / "dense", b"dense weights")
    draft = draft_of(tmp_path / "draft", dense)
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    with open_registry(url) as registry:
        register_example_base(registry, str(dense), weights_sha256=weights_sha256(dense))
        register_example_variant(registry, [2, 3], base_model=str(dense), checkpoint=draft, alias="ppl-best")
    return url, dense, draft


def test_parse_names_draft_and_k():
    assert [
        (r.name, r.draft, r.num_speculative_tokens) for r in parse_speculative("a=ppl-best:3, b=/x/y")
    ] == [
        ("a", "ppl-best", 3),
        ("b", "/x/y", DEFAULT_NUM_SPECULATIVE_TOKENS),
    ]
    for bad in ("a=ppl-best:0", "a=ppl-best:-2", "a=ppl-best:x", "=ppl-best", "a="):
        with pytest.raises(UserError):
            parse_speculative(bad)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("s=ppl-best:1000", "must be in 1..32, got 1000"),  # issue 57, 3: engines started with it
        ("a=ppl-best:3,,b=ppl-best", "has an empty item (item 2 of 3)"),  # issue 57, 6: skipped silently
        ("a=ppl-best:3,", "has an empty item (item 2 of 2)"),
        (
            "ünï=ppl-best",
            "only ASCII letters, digits",
        ),  # issue 57, 6: accepted though the rule says otherwise
        ("-a=ppl-best", "starting with a letter or digit"),
    ],
)
def test_an_impossible_k_an_empty_item_or_a_bad_name_is_refused(text, message):
    with pytest.raises(UserError, match=re.escape(message)):
        parse_speculative(text)
    assert parse_speculative(None) == parse_speculative("") == []
    assert parse_speculative(f"s=x:{MAX_NUM_SPECULATIVE_TOKENS}")[0].num_speculative_tokens == 32


def test_k_must_be_shorter_than_the_draft_and_the_target_context(served, tmp_path, run_cli):
    url, dense, _ = served
    short = draft_of(tmp_path / "short-draft", dense, max_position_embeddings=8)
    code, _, err = run_cli("serve", "--variants", "dense", "--registry", url, "--speculative", f"s={short}:8")
    assert code == 2 and "shorter than the draft's context of 8 tokens" in err and err.count("\n") == 1, err
    code, _, err = run_cli(
        "serve",
        "--variants",
        "dense",
        "--registry",
        url,
        "--speculative",
        "s=ppl-best:20",
        "--max-model-len",
        "16",
    )
    assert code == 2 and "shorter than --max-model-len of 16 tokens" in err, err


def test_a_speculative_arm_serves_dense_with_the_draft(served):
    url, dense, draft = served
    settings = build_settings(
        {"variants": "dense", "registry": url, "speculative": "dense-spec=ppl-best:3"}, {}
    )
    spec = {backend.name: backend for backend in settings.backends}["dense-spec"]
    assert spec.model_dir == str(dense) and spec.speculative.model_dir == str(draft.resolve())
    assert spec.metadata.speculative == {"draft": "ppl-best", "num_speculative_tokens": 3, "target": "dense"}
    command = Backend(spec, VllmOptions(), port=8001).command()
    config = json.loads(command[command.index("--speculative-config") + 1])
    assert config == {"method": "draft_model", "model": str(draft.resolve()), "num_speculative_tokens": 3}
    assert command[command.index("--served-model-name") + 1] == "dense-spec"


@pytest.mark.parametrize(
    ("make_draft", "reason"),
    [
        (lambda tmp, dense: draft_of(tmp / "other-vocab", dense, vocab_size=512), "vocabulary"),
        (lambda tmp, dense: draft_of(tmp / "other-base", dense, base_sha="f" * 64), "other weights"),
        (
            lambda tmp, dense: (
                (draft_of(tmp / "other-tok", dense) / "tokenizer.json").write_text("{}") and tmp / "other-tok"
            ),
            "tokenizer",
        ),
    ],
)
def test_a_draft_of_another_base_or_vocabulary_is_refused_in_one_line(
    served, tmp_path, run_cli, make_draft, reason
):
    url, dense, _ = served
    draft = make_draft(tmp_path, dense)
    code, _, err = run_cli("serve", "--variants", "dense", "--registry", url, "--speculative", f"s={draft}:3")
    assert code == 2 and reason in err and len(err.strip().splitlines()) == 1, err


def test_k_below_one_is_refused_in_one_line(served, run_cli):
    url, _, _ = served
    code, _, err = run_cli("serve", "--variants", "dense", "--registry", url, "--speculative", "s=ppl-best:0")
    assert code == 2 and "must be in 1..32" in err and len(err.strip().splitlines()) == 1, err


def test_the_memory_plan_counts_the_draft():
    from ground.planning import plan_devices, plan_serve

    devices = plan_devices("cuda", 1, 24)
    alone = plan_serve([("dense", CONFIG, 1)], "bfloat16", devices, 256)
    drafted = plan_serve([("dense", CONFIG, 1, {**CONFIG, "num_hidden_layers": 4})], "bfloat16", devices, 256)
    need = [sum(item.bytes for step in plan.steps for item in step.items) for plan in (alone, drafted)]
    assert need[1] > need[0]


VLLM_METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="dense-spec"} 10.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="dense-spec"} 30.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="dense-spec"} 21.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="dense-spec",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="dense-spec",position="1"} 7.0
"""


def test_acceptance_counters_are_read_and_reexported_per_served_name():
    counts = spec_decode_counts(VLLM_METRICS)
    assert (
        counts["vllm:spec_decode_num_accepted_tokens"] == 21 and counts["vllm:spec_decode_num_drafts"] == 10
    )
    metrics = GatewayMetrics()
    metrics.spec_decode.counts["dense-spec"] = counts
    text = metrics.render().decode()
    assert 'depthprune_gateway_spec_decode_num_accepted_tokens_total{variant="dense-spec"} 21.0' in text
    assert 'depthprune_gateway_spec_decode_num_draft_tokens_total{variant="dense-spec"} 30.0' in text
    assert 'spec_decode_num_accepted_tokens_per_pos_total{position="1",variant="dense-spec"} 7.0' in text


def test_the_load_test_reports_acceptance_beside_the_speedup():
    from loadtest.compare import attach_acceptance
    from loadtest.report import _speculative_table

    before = {"dense-spec": {"drafts": 10, "draft_tokens": 30, "accepted_tokens": 21}}
    after = {"dense-spec": {"drafts": 110, "draft_tokens": 330, "accepted_tokens": 171}}
    result = {
        "baseline": "dense",
        "comparison": {
            "dense-spec": {"output_throughput_speedup": 0.8, "output_throughput_speedup_ci95": [0.7, 0.9]}
        },
    }
    attach_acceptance(result, before, after)
    entry = result["speculative"]["dense-spec"]
    assert entry["draft_tokens"] == 300 and entry["acceptance_rate"] == pytest.approx(0.5)
    assert entry["mean_accepted_length"] == pytest.approx(2.5)
    # Leviathan et al.'s per-token α: 1 + α + α² + α³ = 2.5 at K = 3, not the rate 0.5
    assert entry["k"] == 3 and entry["alpha_token"] == pytest.approx(0.6914, abs=1e-4)
    assert result["comparison"]["dense-spec"]["acceptance_rate"] == pytest.approx(0.5)
    row = _speculative_table(result)[-1]
    assert "| dense-spec | 300 | 150 | 0.500 | 2.50 | 0.80x [0.70, 0.90]" in row
