"""The subset evaluator: exact (equals the written pruned checkpoint), fast paths agree with naive, memo,
counters, gradients, Block Influence and bad input."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from depthprune.testing.cli import run_cli
from depthprune.testing.data import demo_like_model, random_questions, random_texts, read_jsonl, write_jsonl
from ground.core.errors import UserError
from pruning.calibration.config import CalibrationConfig
from pruning.calibration.scoring.build import build_evaluator
from pruning.calibration.scoring.memo import data_sha256
from pruning.calibration.scoring.shortcuts import plan_boundaries

SAMPLES, SEQ_LEN = 6, 24


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_model_dirs):
    """A tiny 6-block llama on disk plus hand-made text and question files in its vocabulary."""
    root = tmp_path_factory.mktemp("evaluator-data")
    rng = random.Random(0)
    text = write_jsonl(root / "text.jsonl", random_texts(rng, rows=8, words=50))
    questions = random_questions(rng, rows=10, choices=(2, 3, 4), context_words=(3, 10), choice_words=(1, 4))
    return {
        "model": str(tiny_model_dirs("llama")),
        "text": f"text:{text}",
        "mc": f"mc:{write_jsonl(root / 'qa.jsonl', questions)}",
        "root": root,
    }


def config_for(files, objective):
    return CalibrationConfig(
        objective,
        files["mc" if objective == "task_margin" else "text"],
        samples=SAMPLES,
        seq_len=SEQ_LEN,
        seed=1,
    )


@pytest.fixture(scope="module")
def evaluators(files):
    made = {}

    def get(objective, **options):
        key = (objective, tuple(sorted(options.items())))
        if key not in made:
            made[key] = build_evaluator(
                files["model"], config_for(files, objective), progress=False, batch_size=4, **options
            )
        return made[key]

    return get


OBJECTIVE_NAMES = ["perplexity", "task_margin", "kl"]


def reference_loss(objective, evaluator, model, dense_model=None):
    """The calibration loss by a plain forward of ``model`` per calibration sequence."""
    losses = []
    for batch in evaluator.batches:
        for row in range(batch.input_ids.shape[0]):
            length = int(batch.token_mask[row].sum())
            ids = batch.input_ids[row : row + 1, :length]
            with torch.no_grad():
                logprobs = torch.log_softmax(model(ids, use_cache=False).logits[0], dim=-1)
                if objective == "perplexity":
                    losses.append(-logprobs[:-1].gather(1, ids[0, 1:, None]).mean())
                elif objective == "kl":
                    dense = torch.log_softmax(dense_model(ids, use_cache=False).logits[0], dim=-1)
                    losses.append((dense.exp() * (dense - logprobs)).sum(-1).mean())
                else:
                    picked = batch.answer_rows == row
                    positions, tokens = batch.answer_positions[picked], batch.answer_tokens[picked]
                    losses.append(logprobs[positions, tokens].mean())  # ℓ of this choice, finished below
        if objective == "task_margin":
            ell = torch.stack(losses[-batch.input_ids.shape[0] :])
            del losses[-batch.input_ids.shape[0] :]
            for item in range(batch.num_samples):
                mine = (batch.sequence_item == item).nonzero()[:, 0]
                correct = int(batch.correct_sequence[item])
                losses.append(-sum(ell[correct] - ell[j] for j in mine.tolist() if j != correct))
    return float(torch.stack(losses).double().mean())


@pytest.mark.parametrize("objective", OBJECTIVE_NAMES)
def test_score_equals_the_written_pruned_checkpoint(files, evaluators, objective, tmp_path):
    from transformers import AutoModelForCausalLM

    from pruning.model.checkpoint import write_pruned_checkpoint

    evaluator = evaluators(objective)
    removed = frozenset({1, 4})
    variant = write_pruned_checkpoint(files["model"], sorted(removed), tmp_path / "variant")
    pruned = AutoModelForCausalLM.from_pretrained(variant.path).eval()
    assert pruned.config.num_hidden_layers == 4
    dense = AutoModelForCausalLM.from_pretrained(files["model"]).eval() if objective == "kl" else None
    assert evaluator.score(removed) == pytest.approx(
        reference_loss(objective, evaluator, pruned, dense), abs=1e-5
    )


def random_sets(num_blocks, count, seed=0):
    rng = random.Random(seed)
    return [frozenset(rng.sample(range(num_blocks), rng.randint(1, num_blocks - 1))) for _ in range(count)]


@pytest.mark.parametrize("objective", OBJECTIVE_NAMES)
def test_fast_and_budget_limited_agree_with_naive(evaluators, objective):
    fast, naive = evaluators(objective), evaluators(objective, naive=True)
    # 0 GiB keeps only boundary 0; the KL reference then falls back to re-running the dense head.
    starved = evaluators(objective, memory_budget_gb=0.0)
    assert fast.boundaries == list(range(6)) and starved.boundaries == [0] and naive.boundaries == []
    if objective == "kl":
        assert fast.cache_reference_logprobs and not starved.cache_reference_logprobs
    for removed in [frozenset(), frozenset({0}), frozenset({3}), frozenset({5}), *random_sets(6, 3)]:
        expected = naive.score(removed)
        assert fast.score(removed) == pytest.approx(expected, abs=1e-5)
        assert starved.score(removed) == pytest.approx(expected, abs=1e-5)


def test_plan_boundaries():
    assert plan_boundaries(16, 99) == list(range(16))
    assert plan_boundaries(16, 4) == [0, 4, 8, 12]
    assert plan_boundaries(6, 0) == [0]
    assert plan_boundaries(7, 3) == [0, 2, 4]


def test_memo_and_counters(files):
    evaluator = build_evaluator(files["model"], config_for(files, "perplexity"), progress=False, batch_size=4)
    batches = len(evaluator.batches)
    assert batches == 2  # 6 windows in batches of 4
    setup = evaluator.stats.block_forwards
    assert setup == 6 * batches  # the dense reference pass
    first = evaluator.score(frozenset({3}))
    # the suffix from boundary 3 without block 3: blocks 4 and 5
    assert evaluator.stats.block_forwards - setup == 2 * batches
    assert evaluator.stats.tokens == (6 + 2) * SAMPLES * SEQ_LEN  # every window through 6, then 2 blocks
    assert evaluator.score({3}) == first and evaluator.score([3]) == first
    assert (evaluator.stats.evaluations, evaluator.stats.memo_hits) == (1, 2)
    assert evaluator.dense_loss() != first
    assert evaluator.stats.evaluations == 1  # the dense loss came from the reference pass

    singles = evaluator.single_block_scores()
    assert singles[3] == first and evaluator.stats.evaluations == 6
    evaluations = evaluator.stats.evaluations
    np.testing.assert_array_equal(evaluator.single_block_scores(), singles)
    assert evaluator.stats.evaluations == evaluations
    assert evaluator.stats.wall_seconds > 0 and evaluator.stats.setup_seconds > 0

    naive = build_evaluator(
        files["model"], config_for(files, "perplexity"), progress=False, batch_size=4, naive=True
    )
    before = naive.stats.block_forwards
    naive.score({3})
    naive.score({3})
    assert naive.stats.block_forwards - before == 2 * 5 * batches
    assert (naive.stats.evaluations, naive.stats.memo_hits) == (2, 0)


def test_memo_save_and_load(files, evaluators, tmp_path):
    evaluator = evaluators("perplexity")
    evaluator.score({0, 2})
    path = evaluator.save_memo(tmp_path / "memo.json")
    fresh = build_evaluator(files["model"], config_for(files, "perplexity"), progress=False, batch_size=4)
    assert fresh.load_memo(path) >= 2
    before = fresh.stats.evaluations
    assert fresh.score({0, 2}) == evaluator.score({0, 2})
    assert fresh.stats.evaluations == before and fresh.stats.memo_hits == 1

    other = build_evaluator(
        files["model"],
        CalibrationConfig("perplexity", files["text"], samples=SAMPLES, seq_len=SEQ_LEN, seed=2),
        progress=False,
    )
    with pytest.raises(UserError, match="was made for config"):
        other.load_memo(path)
    with pytest.raises(UserError, match="does not exist"):
        fresh.load_memo(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(UserError, match="not valid JSON"):
        fresh.load_memo(tmp_path / "bad.json")


def test_a_memo_of_other_calibration_data_is_set_aside_and_an_older_one_is_used_saying_so(
    files, tmp_path, capsys
):
    """A configuration names its data, not its contents: the same name over other tokens (a file edited, a
    sampling fix) must not hand back the old scores."""
    data = tmp_path / "text.jsonl"
    write_jsonl(data, random_texts(random.Random(5), rows=8, words=50))
    config = CalibrationConfig("perplexity", f"text:{data}", samples=SAMPLES, seq_len=SEQ_LEN, seed=1)
    first = build_evaluator(files["model"], config, progress=False, batch_size=4)
    first.score({1, 4})
    path = first.save_memo(tmp_path / "memo.json")
    assert json.loads(path.read_text())["data_sha256"] == data_sha256(first)

    older = json.loads(path.read_text())
    del older["data_sha256"]
    (tmp_path / "older.json").write_text(json.dumps(older))
    again = build_evaluator(files["model"], config, progress=False, batch_size=4)
    assert again.load_memo(tmp_path / "older.json") >= 1
    assert "predates calibration-data fingerprints" in capsys.readouterr().err

    write_jsonl(data, random_texts(random.Random(6), rows=8, words=50))  # same name, other contents
    changed = build_evaluator(files["model"], config, progress=False, batch_size=4)
    assert data_sha256(changed) != data_sha256(first)
    assert changed.load_memo(path) == 0 and not path.exists()
    assert frozenset({1, 4}) not in changed._memo
    aside = tmp_path / f"memo.other-data-{data_sha256(first)[:12]}.json"
    assert json.loads(aside.read_text())["scores"]  # set aside whole, not deleted
    assert "was scored on other calibration data" in capsys.readouterr().err


def test_the_data_fingerprint_follows_the_samples_not_their_batching(files, evaluators):
    for objective in ("perplexity", "task_margin"):
        batched = evaluators(objective)  # batch_size 4
        alone = build_evaluator(files["model"], config_for(files, objective), progress=False, batch_size=1)
        assert len(alone.batches) > len(batched.batches)
        assert data_sha256(alone) == data_sha256(batched)
    assert data_sha256(evaluators("perplexity")) != data_sha256(evaluators("task_margin"))


@pytest.mark.slow
def test_residual_gradients_match_finite_differences(files):
    """dL_s/dα_i by central differences on a float64 copy, for every sample and block."""
    evaluator = build_evaluator(
        files["model"], config_for(files, "perplexity"), progress=False, batch_size=4, dtype="float64"
    )
    gradients = evaluator.residual_gradients()
    assert gradients.shape == (SAMPLES, 6)
    stack, loss = evaluator.stack, evaluator.loss

    def per_sample_losses(alphas):
        losses = []
        with torch.no_grad():
            for batch in evaluator.batches:
                prepared = stack.prepare(batch.input_ids)
                hidden = prepared.hidden
                for index, block in enumerate(stack.blocks):
                    output = block(hidden, **prepared.block_kwargs[index])
                    hidden = hidden + alphas[index] * (output - hidden)
                losses.append(loss(batch, hidden, stack.head, None))
        return torch.cat(losses).numpy()

    # RMSNorm computes in float32 even in a float64 model: a step of 1e-3 keeps that rounding below 1e-4.
    step = 1e-3
    for block in range(6):
        up, down = np.ones(6), np.ones(6)
        up[block] += step
        down[block] -= step
        numeric = (per_sample_losses(up) - per_sample_losses(down)) / (2 * step)
        np.testing.assert_allclose(gradients[:, block], numeric, rtol=1e-3, atol=1e-4)


def test_residual_gradients_per_item_and_kl(evaluators):
    margin = evaluators("task_margin")
    gradients = margin.residual_gradients()
    assert gradients.shape == (SAMPLES, 6) and np.abs(gradients).sum() > 0
    # KL(dense || dense) is a minimum: its gradient vanishes
    np.testing.assert_allclose(evaluators("kl").residual_gradients(), 0, atol=1e-6)


def test_block_influence_matches_hidden_states(files, evaluators):
    from transformers import AutoModelForCausalLM

    evaluator = evaluators("perplexity")
    model = AutoModelForCausalLM.from_pretrained(files["model"]).eval()
    cosines = []
    for batch in evaluator.batches:
        with torch.no_grad():
            states = model(batch.input_ids, output_hidden_states=True, use_cache=False).hidden_states
        # hidden_states[i] enters block i; the last entry is after the final norm, so block 5 is left out
        cosines.append(
            torch.stack(
                [
                    torch.nn.functional.cosine_similarity(states[i], states[i + 1], dim=-1).flatten()
                    for i in range(5)
                ]
            )
        )
    expected = 1 - torch.cat(cosines, dim=1).mean(dim=1)
    influence = evaluator.block_influence()
    assert influence.shape == (6,)
    np.testing.assert_allclose(influence[:5], expected.numpy(), atol=1e-5)


@pytest.mark.parametrize("architecture", ["qwen3", "gemma3_text"])
def test_other_architectures_fast_equals_naive(files, tiny_model_dirs, architecture):
    model = str(tiny_model_dirs(architecture))
    config = CalibrationConfig("perplexity", files["text"], samples=3, seq_len=SEQ_LEN)
    fast = build_evaluator(model, config, progress=False, batch_size=2)
    naive = build_evaluator(model, config, progress=False, batch_size=2, naive=True)
    for removed in [frozenset({0}), frozenset({2, 3}), frozenset({1, 5})]:
        assert fast.score(removed) == pytest.approx(naive.score(removed), abs=1e-5)


def test_bad_input(files, evaluators, tmp_path):
    evaluator = evaluators("perplexity")
    with pytest.raises(UserError, match="cannot remove all 6 blocks"):
        evaluator.score(frozenset(range(6)))
    with pytest.raises(UserError, match="out of range"):
        evaluator.score({6})
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"context": "w4", "choices": ["w5", "w6"], "label": 5}) + "\n")
    with pytest.raises(UserError, match="bad.jsonl:1: 'label' must be"):
        build_evaluator(
            files["model"], CalibrationConfig("task_margin", f"mc:{bad}", samples=1), progress=False
        )
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    with pytest.raises(UserError, match="has no text"):
        build_evaluator(files["model"], CalibrationConfig("perplexity", f"text:{empty}"), progress=False)
    with pytest.raises(UserError, match="not a model directory"):
        build_evaluator(str(tmp_path), config_for(files, "perplexity"), progress=False)
    with pytest.raises(UserError, match="fewer than the 64 samples"):
        build_evaluator(
            files["model"], CalibrationConfig("perplexity", files["text"], seq_len=SEQ_LEN), progress=False
        )


def test_bench_evaluator_command(files):
    """The benchmark command end to end on the tiny model: one JSON object, scores agree."""
    model = files["root"] / "tiny-with-demo-data"
    if not model.exists():
        questions = read_jsonl(files["mc"].removeprefix("mc:"))
        demo_like_model(files["model"], model, {"qa_calibration": questions})
    code, out, _ = run_cli(
        "bench-evaluator",
        "--model",
        model,
        "--samples",
        "4",
        "--seq-len",
        "32",
        "--random-sets",
        "3",
        "--budget",
        "2",
        "--batch-size",
        "8",
        "--repeats",
        "2",
        "--no-pack",
        "--json",
    )
    assert code == 0
    result = json.loads(out)
    assert result["agree"] and result["sets"] == 6 + 3
    assert result["repeats"] == 2 and len(result["fast_seconds_each"]) == 2 and not result["packed"]
    assert result["fast_block_forwards"] < result["naive_block_forwards"]
    assert result["calibration"]["data"] == f"demo:qa@{model}"
    code, _, err = run_cli("bench-evaluator", "--model", model, "--budget", "6", "--samples", "4")
    assert code == 2
    assert "budget M=6 must be between 1 and 5" in err


@pytest.fixture(scope="module")
def edge_questions(files):
    """Items that stress the packing: a prompt truncated differently per choice (seq_len 16), choices
    sharing their first answer token, a choice that is a prefix of another, a duplicate choice."""
    path = files["root"] / "edge-qa.jsonl"
    long_context = " ".join(f"w{i}" for i in range(10, 30))
    rows = [
        {"context": long_context, "choices": ["w5", "w5 w6 w7", "w8"], "label": 1},
        {"context": "w40 w41 w42 w43 w44 w45", "choices": ["w9 w10", "w9 w11", "w9 w10", "w9"], "label": 0},
        {"context": "w50 w51 w52 w53 w54 w55 w56 w57 w58", "choices": ["w60 w61", "w62"], "label": 1},
        {"context": "w70", "choices": ["w71 w72 w73 w74", "w75"], "label": 0},
    ]
    return f"mc:{write_jsonl(path, rows)}"


@pytest.mark.parametrize("architecture", ["llama", "qwen3", "gemma3_text"])
def test_packed_choices_equal_per_choice_and_the_pruned_checkpoint(
    files, edge_questions, tiny_model_dirs, architecture, tmp_path
):
    """Prompt sharing is exact: packed = one sequence per choice = the written pruned checkpoint.

    gemma3_text has sliding-window layers (window 8) shorter than most prompt + answer sequences here.
    """
    from transformers import AutoModelForCausalLM

    from pruning.model.checkpoint import write_pruned_checkpoint

    model = str(tiny_model_dirs(architecture))
    removed_sets = [frozenset({1, 4}), frozenset({0}), frozenset({5}), frozenset({2, 3, 5})]
    for data, seq_len in ((files["mc"], SEQ_LEN), (edge_questions, 16)):
        # --truncate: the edge items' prompts are cut on purpose (differently per choice)
        config = CalibrationConfig("task_margin", data, samples=4, seq_len=seq_len, seed=1, truncate=True)
        packed = build_evaluator(model, config, progress=False, batch_size=7)
        per_choice = build_evaluator(model, config, progress=False, batch_size=7, pack_choices=False)
        assert packed.packed and not per_choice.packed
        sequences = sum(batch.input_ids.shape[0] for batch in packed.batches)
        assert sum(run.input_ids.shape[0] for run in packed.run_batches) == 4 < sequences  # a row per item
        assert len(packed.run_batches) < len(packed.batches)  # up to 7 items per forward: batches merged
        # real (non-padding) positions: the shared prefix once instead of once per choice
        real = sum(int((run.token_weight > 0).sum()) for run in packed.run_batches)
        assert real < sum(int(batch.token_mask.sum()) for batch in packed.batches)
        for removed in removed_sets:
            assert packed.score(removed) == pytest.approx(per_choice.score(removed), abs=1e-5)
        variant = write_pruned_checkpoint(model, sorted(removed_sets[0]), tmp_path / f"variant-{seq_len}")
        pruned = AutoModelForCausalLM.from_pretrained(variant.path).eval()
        expected = reference_loss("task_margin", per_choice, pruned)
        assert packed.score(removed_sets[0]) == pytest.approx(expected, abs=1e-5)
        np.testing.assert_allclose(packed.block_influence(), per_choice.block_influence(), atol=1e-6)
        np.testing.assert_allclose(packed.residual_gradients(), per_choice.residual_gradients(), atol=1e-5)


def test_held_out_accuracy_packs_choices_and_agrees_with_one_row_per_choice(demo_tiny_dir, monkeypatch):
    """Held-out accuracy runs each item's choices as one packed sequence (the prompt once) and gives every
    choice the score of one row per choice (the trained demo model: a random one barely reads positions)."""
    import pruning.pipeline.heldout as heldout
    from pruning.calibration.scoring.packing import as_run_batch

    model = str(demo_tiny_dir)
    config = CalibrationConfig("task_margin", f"demo:qa@{model}", samples=12, seq_len=64, seed=1)
    scorer = build_evaluator(model, config, progress=False, naive=True)  # as held-out scoring builds it
    assert sum(run.input_ids.shape[0] for run in heldout.choice_runs(scorer)) == 12  # a row per item
    removed_sets = [frozenset(), frozenset({1, 4}), frozenset({0}), frozenset({2, 3, 5})]
    packed = [heldout.choice_scores(scorer, removed) for removed in removed_sets]
    accuracy = [heldout.choice_accuracy(scorer, removed) for removed in removed_sets]
    monkeypatch.setattr(heldout, "choice_runs", lambda s: [as_run_batch(b.to("cpu")) for b in s.batches])
    for removed, scored in zip(removed_sets, packed):
        per_choice = torch.cat([scores for _, scores in heldout.choice_scores(scorer, removed)])
        torch.testing.assert_close(torch.cat([scores for _, scores in scored]), per_choice, atol=1e-5, rtol=0)
    assert accuracy == [heldout.choice_accuracy(scorer, removed) for removed in removed_sets]


def test_packing_layout(files, edge_questions):
    """The packed rows: the longest common prefix once, then each choice's remaining tokens."""
    config = CalibrationConfig("task_margin", edge_questions, samples=4, seq_len=16, seed=1, truncate=True)
    evaluator = build_evaluator(files["model"], config, progress=False, batch_size=16)
    assert evaluator.truncated_items >= 1  # the long context at least
    (batch,), (run,) = evaluator.batches, evaluator.run_batches
    lengths = batch.token_mask.sum(dim=1).tolist()
    for item in range(4):
        rows = (batch.sequence_item == item).nonzero()[:, 0].tolist()
        sequences = [batch.input_ids[row, : lengths[row]].tolist() for row in rows]
        shared = 0
        while all(len(s) > shared and s[shared] == sequences[0][shared] for s in sequences):
            shared += 1
        expected = sequences[0][:shared] + [t for s in sequences for t in s[shared:]]
        weight = run.token_weight[item]
        assert run.input_ids[item, : len(expected)].tolist() == expected
        assert weight[:shared].tolist() == [len(rows)] * shared and int((weight > 0).sum()) == len(expected)
        assert weight.sum() == sum(lengths[row] for row in rows)
    # the item whose choices all start with w9 shares that answer token too
    assert run.token_weight[1].max() == 4


def test_naive_and_text_objectives_are_not_packed(evaluators):
    assert evaluators("task_margin").packed and not evaluators("task_margin", naive=True).packed
    assert not evaluators("perplexity").packed


def test_compare_with_naive_interleaves_repeats(files):
    from pruning.calibration.scoring.bench import compare_with_naive

    result = compare_with_naive(
        files["model"],
        config_for(files, "task_margin"),
        budget=2,
        random_sets=2,
        batch_size=8,
        progress=False,
        repeats=2,
    )
    assert result["agree"] and result["packed"] and result["repeats"] == 2
    assert len(result["fast_seconds_each"]) == len(result["naive_seconds_each"]) == 2
    assert result["packed_sequences"] == SAMPLES < result["sequences"]
    assert result["fast_tokens"] < result["naive_tokens"]
    with pytest.raises(UserError, match="repeats must be a positive integer"):
        compare_with_naive(files["model"], config_for(files, "task_margin"), repeats=0, progress=False)


def test_a_reference_objective_not_zero_at_dense_has_its_dense_loss_computed(files, monkeypatch):
    """``zero_loss_at_dense`` alone lets the reference pass skip the dense loss: without it (a KL-weighted
    objective), the loss is computed with the dense reference, here KL(dense || dense) = 0 up to rounding."""
    import dataclasses

    from ground.core import objectives

    def build():
        return build_evaluator(files["model"], config_for(files, "kl"), progress=False, batch_size=4)

    skipped = build()
    kl = objectives.OBJECTIVES["kl"]
    monkeypatch.setitem(objectives.OBJECTIVES, "kl", dataclasses.replace(kl, zero_loss_at_dense=False))
    computed = build()
    assert skipped.dense_loss() == 0.0 and abs(computed.dense_loss()) < 1e-5
    assert computed.stats.head_positions > skipped.stats.head_positions


@pytest.mark.parametrize(("objective", "scorers"), [("perplexity", 1), ("kl", 2)])
def test_held_out_scores_each_removal_set_once_per_measure(files, monkeypatch, objective, scorers):
    """Under the perplexity objective the validation loss is the held-out log perplexity: one pass per
    removal set, not two."""
    from pruning.calibration.scoring.evaluator import SubsetEvaluator
    from pruning.pipeline.heldout import HeldOut

    evaluator = build_evaluator(files["model"], config_for(files, objective), progress=False, batch_size=4)
    calls = []
    score = SubsetEvaluator.score
    monkeypatch.setattr(
        SubsetEvaluator, "score", lambda self, removed: calls.append(self) or score(self, removed)
    )
    held_out = HeldOut(evaluator)
    quality = held_out.quality([2, 3])
    # dense, then [2, 3]: once each per scorer
    assert len(calls) == 2 * scorers and len({id(scorer) for scorer in calls}) == scorers
    if objective == "perplexity":
        assert quality["perplexity"] == pytest.approx(np.exp(quality["validation_loss"]))
        assert quality["dense_perplexity"] == pytest.approx(np.exp(held_out.dense["validation_loss"]))
