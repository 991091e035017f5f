"""Evaluation: the lm-eval adapter against a plain-torch reference, perplexity, the demo suites."""

from __future__ import annotations

import json
import math
import random

import pytest

from depthprune.testing.cli import run_cli
from depthprune.testing.data import demo_like_model, random_questions, random_texts
from ground.core.errors import UserError

CONTEXT_PAIRS = [
    ("w10 w11 w12", " w13 w14"),
    ("w20 w21 ", "w22"),  # trailing space moves into the continuation
    ("", "w30 w31 w32"),  # empty context: conditioned on the BOS token
    ("w40 " * 30, " w41 w42 w43"),
]


def reference_loglikelihood(model, tokenizer, context: str, continuation: str) -> float:
    """Plain torch: sum of log p(continuation tokens) with the same token split lm-eval's HF model uses."""
    import torch

    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    whole = encode(context + continuation)
    context_ids = encode(context) if context else []
    continuation_ids = whole[len(context_ids) :]
    if not context_ids:
        context_ids = [tokenizer.bos_token_id]
    ids = torch.tensor([context_ids + continuation_ids])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    return sum(float(logprobs[len(context_ids) - 1 + i, token]) for i, token in enumerate(continuation_ids))


@pytest.fixture(scope="module")
def tiny_llama(tiny_model_dirs):
    return str(tiny_model_dirs("llama"))


@pytest.fixture(scope="module")
def torch_lm(tiny_llama):
    from pruning.evaluation.lm_eval_models import TransformersLM

    return TransformersLM(tiny_llama, progress=False)


@pytest.fixture(scope="module")
def demo_like_dir(tmp_path_factory, tiny_llama):
    """A tiny model directory with demo-style held-out data (data/text_test.jsonl, data/qa_test.jsonl)."""
    rng = random.Random(0)
    data = {
        "text_test": random_texts(rng, rows=6, words=40),
        "qa_test": random_questions(rng, rows=12, choices=3, context_words=6, choice_words=2, labels="cycle"),
    }
    return demo_like_model(tiny_llama, tmp_path_factory.mktemp("demo-like") / "model", data)


def instances(pairs):
    from lm_eval.api.instance import Instance

    return [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]


def test_transformers_lm_matches_plain_torch_reference(torch_lm):
    answers = torch_lm.loglikelihood(instances(CONTEXT_PAIRS))
    for (context, continuation), (logprob, greedy) in zip(CONTEXT_PAIRS, answers):
        expected = reference_loglikelihood(torch_lm.engine.model, torch_lm.tokenizer, context, continuation)
        assert logprob == pytest.approx(expected, abs=1e-4)
        assert isinstance(greedy, bool)
        assert logprob < 0


def test_is_greedy_follows_argmax(torch_lm):
    import torch

    ids = torch.tensor([[10, 11]])  # the tiny tokenizer adds no BOS
    with torch.no_grad():
        logits = torch_lm.engine.model(input_ids=ids).logits[0, -1]
    best, worst = 4 + int(logits[4:].argmax()), 4 + int(logits[4:].argmin())  # ids 0..3 are special tokens
    (_, greedy), (_, not_greedy) = torch_lm.loglikelihood(
        instances([("w10 w11", f" w{best}"), ("w10 w11", f" w{worst}")])
    )
    assert greedy is (int(logits.argmax()) == best)
    assert not_greedy is False


def test_rolling_loglikelihood_scores_every_token_once(torch_lm):
    from lm_eval.api.instance import Instance

    text = " ".join(f"w{4 + i % 200}" for i in range(300))  # longer than the model's 256-token context
    (total,) = torch_lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    # the first 255 tokens in one window from BOS, the remaining 45 with full left context
    head = reference_loglikelihood(
        torch_lm.engine.model, torch_lm.tokenizer, "", " ".join(text.split()[:255])
    )
    assert math.isfinite(total) and total < head < 0


def test_perplexity_matches_reference_windows(torch_lm):
    import torch

    from pruning.evaluation.suites import perplexity

    windows = [[4 + (i * 7 + j) % 250 for j in range(32)] for i in range(3)]
    value, tokens = perplexity(torch_lm.engine, windows)
    assert tokens == 3 * 31
    with torch.no_grad():
        logits = torch_lm.engine.model(input_ids=torch.tensor(windows)).logits
    nll = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), torch.tensor(windows)[:, 1:].reshape(-1)
    )
    assert value == pytest.approx(math.exp(float(nll)), rel=1e-5)


def test_generate_until_stops_at_stop_string(torch_lm):
    from lm_eval.api.instance import Instance

    (free,) = torch_lm.generate_until([Instance("generate_until", {}, ("w10 w11", {"max_gen_toks": 5}), 0)])
    assert len(free.split()) == 5
    stop = free.split()[2]
    (cut,) = torch_lm.generate_until(
        [Instance("generate_until", {}, ("w10 w11", {"until": [stop], "max_gen_toks": 5}), 0)]
    )
    assert stop not in cut and free.startswith(cut)


def test_demo_suite_accuracy_equals_hand_computed(demo_like_dir):
    from pruning.evaluation.suites import EvalSettings, evaluate_model, prepare_data

    settings = EvalSettings(suites=("demo",), engine="torch", seq_len=64, progress=False)
    prepared = prepare_data(["demo"], demo_like_dir)
    results = {
        (r.task, r.metric): r for r in evaluate_model(str(demo_like_dir), ["demo"], prepared, settings)
    }
    from pruning.model.blocks import load_model

    model, tokenizer = load_model(str(demo_like_dir))
    correct = 0
    rows = [json.loads(line) for line in open(demo_like_dir / "data" / "qa_test.jsonl")]
    for row in rows:
        scores = [
            reference_loglikelihood(model, tokenizer, f"Question: {row['context']}\nAnswer:", f" {c}")
            for c in row["choices"]
        ]
        correct += int(max(range(len(scores)), key=scores.__getitem__) == row["label"])
    assert results[("demo_qa", "acc")].value == pytest.approx(correct / len(rows))
    assert ("demo_qa", "acc_norm") in results
    ppl = results[("demo_text", "perplexity")]
    assert ppl.settings["seq_len"] == 64 and ppl.settings["windows"] >= 3
    assert 1 < ppl.value < 1000  # a random 256-word model: near-uniform perplexity


def test_all_suite_means_demo_suites_on_demo_models():
    from pruning.evaluation.suites import expand_suites

    assert expand_suites(["all"], is_demo=True) == ["demo"]
    assert expand_suites(["all"], is_demo=False) == ["perplexity", "zero-shot"]
    assert expand_suites(["perplexity", "all"], is_demo=False) == ["perplexity", "zero-shot"]


def test_real_suites_offline_name_the_demo_suite(monkeypatch, tmp_path):
    from pruning.evaluation.suites import prepare_data

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(UserError, match="--suite demo"):
        prepare_data(["perplexity"], None)


def test_settings_reject_bad_input():
    from pruning.evaluation.suites import EvalSettings

    with pytest.raises(UserError, match="unknown suite"):
        EvalSettings(suites=("speed",))
    with pytest.raises(UserError, match="unknown engine"):
        EvalSettings(engine="tgi")
    with pytest.raises(UserError, match="--limit"):
        EvalSettings(limit=0)


def test_eval_command_records_demo_results_in_registry(demo_like_dir):
    from registry import open_registry

    code, out, _ = run_cli(
        "eval", demo_like_dir, "--suite", "demo", "--engine", "torch", "--limit", 4, "--seq-len", 32, "--json"
    )
    assert code == 0
    (item,) = json.loads(out)
    assert item["variant"] == "dense"
    measured = {(r["task"], r["metric"]): r["value"] for r in item["results"]}
    assert set(measured) == {("demo_text", "perplexity"), ("demo_qa", "acc"), ("demo_qa", "acc_norm")}
    stored = {(e.task, e.metric): e.value for e in open_registry().evaluations(str(demo_like_dir))}
    assert stored == pytest.approx(measured)


def test_eval_command_errors_are_one_line():
    code, _, err = run_cli("eval", "no-such-variant", "--suite", "demo")
    assert code == 2
    assert err.startswith("error: ")
    code, _, err = run_cli("eval", "dense", "--suite", "speed")
    assert code != 0
    assert "unknown suite" in err


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_lm_matches_plain_torch_reference(tiny_llama, torch_lm, monkeypatch):
    """The real vLLM CPU engine (in-process engine core) gives the reference log-likelihoods too."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from pruning.evaluation.lm_eval_models import VllmLM

    vllm_lm = VllmLM(tiny_llama, progress=False)
    try:
        answers = vllm_lm.loglikelihood(instances(CONTEXT_PAIRS))
        expected = torch_lm.loglikelihood(instances(CONTEXT_PAIRS))
        for (logprob, greedy), (reference, reference_greedy) in zip(answers, expected):
            assert logprob == pytest.approx(reference, abs=1e-3)
            assert greedy == reference_greedy
        from lm_eval.api.instance import Instance

        request = Instance("generate_until", {}, ("w10 w11", {"max_gen_toks": 4}), 0)
        (text,) = vllm_lm.generate_until([request])
        (reference_text,) = torch_lm.generate_until([request])
        assert text.split() == reference_text.split()
    finally:
        vllm_lm.close()
