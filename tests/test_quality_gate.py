"""The quality gate and held-out selection, registry side: ``fit`` stored and read back, ``serve`` refusing
an unfit variant by name before any engine starts, ``--best OBJECTIVE`` choosing among the searches that
used the objective by validation loss. No model is loaded."""

from __future__ import annotations

import pytest

from depthprune.testing.cli import run_cli
from ground.core.errors import UserError
from ground.core.fitness import fitness
from ground.core.objectives import OBJECTIVE_FREE_SEARCHES, best_alias
from registry import open_registry
from registry.records import VariantRecord
from registry.selection import best_for_objective
from server.cli import resolve_backends

BASE = "org/Tiny-Llama"
CE = {"objective": "task_ce", "data": "mc:/q.jsonl", "samples": 8, "seq_len": 256, "seed": 0}


def quality(validation_loss: float, fit: bool = True) -> dict:
    return {"validation_loss": validation_loss, "fit": fit, "reasons": [] if fit else ["held-out perplexity"]}


@pytest.fixture
def registry(tmp_path):
    with open_registry(f"sqlite:///{tmp_path / 'registry.db'}") as opened:
        opened.register_base_model(
            BASE, revision="main", weights_sha256="b" * 64, num_blocks=8, architecture="llama"
        )
        yield opened


def register(registry, removed, search, validation_loss, fit=True, calibration=CE):
    record = VariantRecord(
        base_model=BASE,
        removed_blocks=list(removed),
        calibration=dict(calibration),
        search=search,
        search_options={},
        quality=quality(validation_loss, fit),
    )
    return registry.register_variant(record)


def test_fitness_rule():
    assert fitness(150.0, 20.0) == (True, [])
    fit, reasons = fitness(250.0, 20.0)
    assert not fit and "250 > 10 x dense 20" in reasons[0]
    assert fitness(250.0, 20.0, max_ppl_ratio=20)[0]
    assert not fitness(21.0, 20.0, accuracy=0.25, dense_accuracy=0.9, chance=0.25)[0]
    assert not fitness(float("nan"), 20.0)[0]


def test_fit_is_stored_and_an_unfit_variant_is_refused_by_name(registry, tmp_path):
    unfit = register(registry, (1, 2, 3, 4, 5, 6), "one_shot", 9.0, fit=False)
    fit = register(registry, (3,), "greedy", 1.0)
    assert (registry.resolve(unfit.name).fit, registry.resolve(fit.name).fit) == (False, True)
    url = str(registry.engine.url)
    with pytest.raises(UserError, match=f"variant '{unfit.name}' .* is unfit .*--allow-unfit"):
        resolve_backends([(unfit.name, None)], url)
    # allowed: the check goes on to the checkpoint (none here), so the gate did not stop it
    with pytest.raises(UserError, match="has no checkpoint"):
        resolve_backends([(unfit.name, None)], url, allow_unfit=True)
    code, _, err = run_cli("serve", "--variants", unfit.name, "--registry", url)
    assert code != 0 and unfit.name in err and "--allow-unfit" in err
    code, out, _ = run_cli("serve", "--help")
    assert "--allow-unfit" in out


def test_best_is_chosen_among_searches_that_used_the_objective_by_validation_loss(registry):
    assert "block_influence" in OBJECTIVE_FREE_SEARCHES
    register(registry, (1,), "block_influence", 0.1)  # lowest loss, but its search ignored the objective
    with pytest.raises(UserError, match="no variant .* used objective 'task_ce'"):
        best_for_objective(registry, "ce", BASE)
    register(registry, (2,), "greedy", 2.0)
    chosen = register(registry, (3,), "one_shot", 1.5)
    assert best_for_objective(registry, "task_ce", BASE).name == chosen.name
    code, out, err = run_cli(
        "variants", "alias", "--best", "task_ce", "--registry", str(registry.engine.url), "--json"
    )
    assert code == 0, err
    assert best_alias("task_ce") == "ce-best" and registry.resolve("ce-best").name == chosen.name


def register_child(registry, parent, method: str, validation_loss: float | None):
    """A healed child of ``parent`` (its removal, calibration and search), with a validation loss or none."""
    record = VariantRecord(
        base_model=BASE,
        removed_blocks=parent.removed_blocks,
        calibration=dict(parent.calibration),
        search=parent.search,
        search_options=dict(parent.search_options),
        parent=parent.name,
        healing={"method": method, "data": "pydoc", "steps": 0 if method == "patch" else 200},
        quality=None if validation_loss is None else quality(validation_loss),
    )
    return registry.register_variant(record)


def test_a_patched_child_with_a_lower_validation_loss_wins_the_alias(registry):
    parent = register(registry, (3,), "one_shot", 1.5)
    register(registry, (2,), "greedy", 1.2)
    register_child(registry, parent, "patch", None)  # patched before its validation loss was recorded
    assert best_for_objective(registry, "task_ce", BASE).search == "greedy"
    child = register_child(registry, parent, "patch", 1.1)
    assert best_for_objective(registry, "task_ce", BASE).name == child.name
    assert best_for_objective(registry, "task_ce", BASE, repaired=False).search == "greedy"
    code, _, err = run_cli("variants", "alias", "--best", "ce", "--registry", str(registry.engine.url))
    assert code == 0, err
    assert registry.resolve("ce-best").name == child.name


@pytest.mark.parametrize("method", ["lora", "distill", "last-blocks"])
def test_a_trained_child_never_wins_the_alias(registry, method):
    parent = register(registry, (3,), "one_shot", 1.5)
    register_child(registry, parent, method, 0.01)  # even with a (not comparable) lower loss recorded
    assert best_for_objective(registry, "task_ce", BASE).name == parent.name


def test_an_objective_free_search_and_its_patched_child_never_win(registry):
    free = register(registry, (1,), "block_influence", 0.5)
    register_child(registry, free, "patch", 0.1)
    with pytest.raises(UserError, match="no variant .* used objective 'task_ce'"):
        best_for_objective(registry, "task_ce", BASE)
    searched = register(registry, (2,), "greedy", 2.0)
    assert best_for_objective(registry, "task_ce", BASE).name == searched.name


def test_objective_free_searches_are_searches():
    from pruning.search import SEARCHES

    assert OBJECTIVE_FREE_SEARCHES <= set(SEARCHES)


def test_default_validation_items_are_the_calibration_split_minus_the_draw(tmp_path):
    import json

    from pruning.calibration.config import CalibrationConfig
    from pruning.calibration.data.sampling import sample_choices
    from pruning.calibration.data.validation import validation_samples

    path = tmp_path / "qa.jsonl"
    rows = [{"context": f"q{i}", "choices": [f"a{i}", f"b{i}"], "label": i % 2} for i in range(10)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = CalibrationConfig("task_ce", f"mc:{path}", samples=4, seed=3)
    drawn = {item.context for item in sample_choices(config.data, 4, 3).items}
    what, held_out = validation_samples(config, tokenizer=None)
    assert "held-out" in what and len(held_out.items) == 4
    assert not drawn & {item.context for item in held_out.items}
    with pytest.raises(UserError, match="no items left"):
        validation_samples(CalibrationConfig("task_ce", f"mc:{path}", samples=10), tokenizer=None)
    with pytest.raises(UserError, match="--validation 'pydoc' is text data"):
        validation_samples(config, None, "pydoc")
