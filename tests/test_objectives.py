"""Each objective equals a straightforward computation with plain model forwards on a tiny model."""

from __future__ import annotations

import copy

import pytest
import torch

from ground.core.errors import UserError
from ground.core.objectives import objective_label
from pruning.calibration.config import CalibrationConfig
from pruning.calibration.data.items import ChoiceItem, ChoiceSamples, TextSamples
from pruning.calibration.objectives import OBJECTIVES, configured_loss, loss_of
from pruning.calibration.objectives.batches import make_batches, truncated_items
from pruning.model.blocks import BlockStack


@pytest.fixture(scope="module")
def model_and_tokenizer():
    from depthprune.testing.models import tiny_model, tiny_tokenizer

    return tiny_model("llama", seed=1), tiny_tokenizer()


def without_blocks(model, removed):
    """A copy of ``model`` with the blocks deleted from its layer list (what a pruned checkpoint holds)."""
    pruned = copy.deepcopy(model)
    pruned.model.layers = torch.nn.ModuleList(
        block for index, block in enumerate(pruned.model.layers) if index not in removed
    )
    pruned.config.num_hidden_layers = len(pruned.model.layers)
    pruned.config.use_cache = False  # a KV cache would be sized by the old layer numbering
    return pruned


def final_hidden(model, input_ids, removed=()):
    stack = BlockStack(model)
    with torch.no_grad():
        prepared = stack.prepare(input_ids)
        return stack, stack.run_blocks(prepared.hidden, prepared, stack.kept_blocks(removed))


def test_config_checks():
    config = CalibrationConfig("task_margin", "demo:qa")
    assert (config.samples, config.seq_len, config.seed, config.kind) == (64, 2048, 0, "multiple_choice")
    with pytest.raises(UserError, match="unknown objective 'ppl'"):
        CalibrationConfig("ppl", "c4")
    with pytest.raises(UserError, match="objective 'task_margin' needs multiple-choice"):
        CalibrationConfig("task_margin", "c4")
    with pytest.raises(UserError, match="objective 'kl' needs text"):
        CalibrationConfig("kl", "commonsense170k")
    with pytest.raises(UserError, match="unknown data spec"):
        CalibrationConfig("kl", "c5")
    for field, value in (("samples", 0), ("seq_len", 1), ("seed", -1), ("samples", 2.5)):
        with pytest.raises(UserError, match=f"calibration {field} must be an integer"):
            CalibrationConfig("perplexity", "c4", **{field: value})
    assert CalibrationConfig("perplexity", "c4").sampling == "documents"
    assert CalibrationConfig("perplexity", "c4", sampling="stream").sampling == "stream"
    with pytest.raises(UserError, match="unknown sampling 'windows'; use one of documents, stream"):
        CalibrationConfig("perplexity", "c4", sampling="windows")


def test_objectives_share_one_signature():
    import inspect

    shared = ["batch", "hidden", "head", "reference"]
    for objective in OBJECTIVES.values():
        # the shared four, then the objective's declared keyword parameters (each with a default)
        parameters = inspect.signature(loss_of(objective)).parameters
        assert list(parameters) == shared + list(objective.parameters), objective.name
        assert all(parameters[name].default is None for name in objective.parameters)
    assert set(OBJECTIVES) == {"perplexity", "task_margin", "task_ce", "kl"}


def windows(seed=0, count=5, length=20):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(4, 256, (count, length), generator=generator).tolist()


@pytest.mark.parametrize("removed", [(), (2,), (0, 5)])
def test_perplexity_is_mean_token_nll(model_and_tokenizer, removed):
    model, _ = model_and_tokenizer
    samples = TextSamples(windows(), "hand-made")
    (batch,) = make_batches(samples, None, 20, batch_size=8)
    stack, hidden = final_hidden(model, batch.input_ids, removed)
    losses = loss_of(OBJECTIVES["perplexity"])(batch, hidden, stack.head, None)

    pruned = without_blocks(model, removed)
    expected = []
    for window in samples.input_ids:
        with torch.no_grad():
            logits = pruned(torch.tensor([window])).logits[0]
        logprobs = torch.log_softmax(logits, dim=-1)
        expected.append(-sum(logprobs[t, window[t + 1]] for t in range(len(window) - 1)) / (len(window) - 1))
    torch.testing.assert_close(losses, torch.stack(expected), atol=1e-5, rtol=1e-5)


def test_kl_against_dense_distribution(model_and_tokenizer):
    model, _ = model_and_tokenizer
    samples = TextSamples(windows(seed=2, count=3), "hand-made")
    (batch,) = make_batches(samples, None, 20, batch_size=8)
    removed = (1, 3)
    with torch.no_grad():
        dense = torch.log_softmax(model(batch.input_ids).logits, dim=-1)
        pruned = torch.log_softmax(without_blocks(model, removed)(batch.input_ids).logits, dim=-1)
    expected = (dense.exp() * (dense - pruned)).sum(-1).mean(-1)

    stack, hidden = final_hidden(model, batch.input_ids, removed)
    losses = loss_of(OBJECTIVES["kl"])(batch, hidden, stack.head, lambda row: dense[row])
    torch.testing.assert_close(losses, expected, atol=1e-6, rtol=1e-4)
    assert (losses > 0).all()
    _, dense_hidden = final_hidden(model, batch.input_ids)
    zero = loss_of(OBJECTIVES["kl"])(batch, dense_hidden, stack.head, lambda row: dense[row])
    torch.testing.assert_close(zero, torch.zeros(3), atol=1e-6, rtol=0)


ITEMS = [
    ChoiceItem("w10 w11 w12", ("w20", "w21 w22", "w23"), 1),
    ChoiceItem("w30 w31", ("w40 w41 w42", "w43"), 0),
    ChoiceItem("w50 w51 w52 w53 w54", ("w60", "w61", "w62", "w63"), 3),
]


def answer_logprob(model, tokenizer, context, choice):
    """ℓ(choice): mean log-prob of the answer tokens given ``Question: {context}\\nAnswer: {choice}``."""
    prompt = tokenizer(f"Question: {context}\nAnswer:")["input_ids"]
    answer = tokenizer(f" {choice}", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([prompt + answer])).logits[0], dim=-1)
    return sum(logprobs[len(prompt) + k - 1, token] for k, token in enumerate(answer)) / len(answer)


@pytest.mark.parametrize("removed", [(), (4,)])
def test_task_margin_by_hand(model_and_tokenizer, removed):
    model, tokenizer = model_and_tokenizer
    pruned = without_blocks(model, removed)
    expected = []
    for item in ITEMS:
        scores = [answer_logprob(pruned, tokenizer, item.context, choice) for choice in item.choices]
        correct = scores[item.label]
        margin = sum(correct - score for j, score in enumerate(scores) if j != item.label)
        expected.append(-margin)

    # batch_size 5 puts the 3-choice and 2-choice items together and the 4-choice item alone
    batches = make_batches(ChoiceSamples(ITEMS, "hand-made"), tokenizer, 64, batch_size=5)
    assert [batch.num_samples for batch in batches] == [2, 1]
    losses = []
    for batch in batches:
        stack, hidden = final_hidden(model, batch.input_ids, removed)
        positions = []
        losses.append(
            loss_of(OBJECTIVES["task_margin"])(
                batch, hidden, lambda h: positions.append(len(h)) or stack.head(h), None
            )
        )
        # the LM head saw only the answer tokens
        assert sum(positions) == len(batch.answer_tokens) < batch.token_mask.sum()
    torch.testing.assert_close(torch.cat(losses), torch.stack(expected), atol=1e-5, rtol=1e-5)


def choice_scores(model, tokenizer, removed):
    pruned = without_blocks(model, removed)
    return [[answer_logprob(pruned, tokenizer, item.context, c) for c in item.choices] for item in ITEMS]


@pytest.mark.parametrize("removed", [(), (2, 4)])
def test_task_ce_and_clipped_margin_by_hand(model_and_tokenizer, removed):
    """task_ce is −ℓ of the correct choice; a clipped margin is PuDDing's clamped to ±TAU."""
    model, tokenizer = model_and_tokenizer
    scores = choice_scores(model, tokenizer, removed)
    expected_ce = torch.stack([-s[item.label] for s, item in zip(scores, ITEMS)])
    margins = torch.stack(
        [sum(s[item.label] - v for j, v in enumerate(s) if j != item.label) for s, item in zip(scores, ITEMS)]
    )
    tau = float(margins.abs().median())  # clips some items and not others
    (batch,) = make_batches(ChoiceSamples(ITEMS, "hand-made"), tokenizer, 64, batch_size=16)
    stack, hidden = final_hidden(model, batch.input_ids, removed)
    ce = configured_loss(CalibrationConfig("task_ce", "demo:qa"))(batch, hidden, stack.head, None)
    torch.testing.assert_close(ce, expected_ce, atol=1e-5, rtol=1e-5)
    assert (ce >= 0).all()
    clipped = configured_loss(CalibrationConfig("task_margin", "demo:qa", margin_clip=tau))
    torch.testing.assert_close(
        clipped(batch, hidden, stack.head, None), -margins.clamp(-tau, tau), atol=1e-5, rtol=1e-5
    )


def test_kl_weight_adds_kl_over_prompt_and_answer_positions(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    removed = (1, 3)
    (batch,) = make_batches(ChoiceSamples(ITEMS, "hand-made"), tokenizer, 64, batch_size=16)
    lengths = batch.token_mask.sum(1)
    with torch.no_grad():
        dense = torch.log_softmax(model(batch.input_ids).logits, dim=-1)
        pruned = torch.log_softmax(without_blocks(model, removed)(batch.input_ids).logits, dim=-1)
    per_position = (dense.exp() * (dense - pruned)).sum(-1)
    expected_kl = []
    for item in range(len(ITEMS)):
        rows = (batch.sequence_item == item).nonzero()[:, 0].tolist()
        total = sum(per_position[row, : lengths[row]].sum() for row in rows)
        expected_kl.append(total / sum(int(lengths[row]) for row in rows))
    stack, hidden = final_hidden(model, batch.input_ids, removed)
    config = CalibrationConfig("task_ce", "demo:qa", kl_weight=0.5)
    reference = lambda row: dense[row, : lengths[row]]  # noqa: E731
    base = configured_loss(config, with_kl=False)(batch, hidden, stack.head, None)
    combined = configured_loss(config)(batch, hidden, stack.head, reference)
    torch.testing.assert_close(combined, base + 0.5 * torch.stack(expected_kl), atol=1e-5, rtol=1e-4)


def test_objective_parameters_are_checked_and_recorded():
    with pytest.raises(UserError, match="--margin-clip applies to task_margin"):
        CalibrationConfig("task_ce", "demo:qa", margin_clip=1.0)
    with pytest.raises(UserError, match="--margin-clip must be a number > 0"):
        CalibrationConfig("task_margin", "demo:qa", margin_clip=0)
    with pytest.raises(UserError, match="--kl-weight must be a number >= 0"):
        CalibrationConfig("perplexity", "c4", kl_weight=-1)
    with pytest.raises(UserError, match="'kl' is already one"):
        CalibrationConfig("kl", "c4", kl_weight=1)
    plain = CalibrationConfig("task_margin", "demo:qa")
    assert "margin_clip" not in plain.as_record() and plain.loss_floor is None
    clipped = CalibrationConfig("task_margin", "demo:qa", margin_clip=2, kl_weight=0.5)
    assert clipped.as_record()["margin_clip"] == 2.0 and clipped.as_record()["kl_weight"] == 0.5
    assert clipped.loss_floor == pytest.approx(-2 - 0.5e-3) and clipped.needs_reference
    assert objective_label(clipped.as_record()) == "task_margin-clip2-kl0.5"
    assert CalibrationConfig("task_ce", "demo:qa").loss_floor == 0.0


def test_a_long_item_is_refused_with_the_length_needed_or_cut_from_the_left_when_asked(model_and_tokenizer):
    _, tokenizer = model_and_tokenizer
    item = ChoiceItem(" ".join(f"w{i}" for i in range(4, 100)), ("w5 w6", "w7"), 0)
    samples = ChoiceSamples([ITEMS[0], item], "hand-made")
    needed = len(tokenizer(f"Question: {item.context}\nAnswer:")["input_ids"]) + 2
    with pytest.raises(
        UserError, match=f"item 1 of hand-made .* needs {needed} tokens, more than --seq-len 16"
    ):
        make_batches(samples, tokenizer, 16, batch_size=4)
    assert truncated_items(samples, tokenizer, 16) == 1
    (batch,) = make_batches(ChoiceSamples([item], "hand-made"), tokenizer, 16, batch_size=4, truncate=True)
    assert batch.input_ids.shape[1] == 16
    assert batch.answer_tokens.tolist() == [5, 6, 7]
    with pytest.raises(UserError, match="too long for seq_len"):
        make_batches(ChoiceSamples([ChoiceItem("w4", ("w5 w6 w7", "w8"), 0)], "x"), tokenizer, 3, 4, True)


def test_every_registered_objective_has_its_loss_module_and_no_module_is_unregistered():
    """The registry lines and the loss module go together: OBJECTIVES[name] <-> LOSSES[name] <->
    objectives/<name>.py."""
    from pathlib import Path

    import pruning.calibration.objectives as package

    assert set(package.LOSSES) == set(OBJECTIVES)
    for name, objective in OBJECTIVES.items():
        assert objective.name == name and loss_of(objective) is package.LOSSES[name]
        assert package.LOSSES[name].__module__ == f"{package.__name__}.{name}"
    helpers = {"__init__", "batches", "show"}
    modules = {path.stem for path in Path(package.__file__).parent.glob("*.py")} - helpers
    assert modules == set(OBJECTIVES)


def test_objective_facts_drive_synonyms_and_help():
    """The server's synonyms and the ``--objective`` help come from the same table as the pipeline's facts."""
    from ground.core.objectives import canonical_objective, objective_names, objectives_help

    for name, objective in OBJECTIVES.items():
        assert name in objectives_help()
        assert objective_names(name) == {name, *objective.synonyms}
        assert all(canonical_objective(synonym) == name for synonym in objective.synonyms)
    assert canonical_objective("ppl") == "perplexity" and canonical_objective("margin") == "task_margin"
    assert canonical_objective("something-else") == "something-else"


def test_pipeline_and_searches_never_compare_an_objective_name():
    """The prune pipeline's steps, the searches and the memory planner ask an objective's facts; no objective
    name appears in them as a string."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    names = {name for objective in OBJECTIVES.values() for name in objective.names}
    planner = [root / "pruning/runtime/plans.py", *sorted((root / "ground/planning").glob("*.py"))]
    steps = ("config", "plan", "run", "register", "prune")
    for path in [
        *(root / "pruning/pipeline" / f"{step}.py" for step in steps),
        *sorted((root / "pruning/search").glob("*.py")),
        *planner,
    ]:
        constants = {
            node.value
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        }
        assert not constants & names, f"{path.name} names objectives {sorted(constants & names)}"
