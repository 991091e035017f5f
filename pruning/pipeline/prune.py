"""The ``prune`` pipeline: calibration configuration → search(es) → pruned checkpoint(s) → registry.

``depthprune prune --model M --objective perplexity --data demo:text --drop 4 --search greedy`` runs here:

1. plan (:mod:`.plan`): :func:`plan_prune` checks everything the user typed (search names, options, budget
   against the model's block count, data spec) before any weights are loaded, so a mistake is a one-line
   error;
2. one :class:`~pruning.calibration.scoring.evaluator.SubsetEvaluator` is built and shared by every search of
   the run (``--search all``), so the single-block prior and every memoised subset are computed once;
3. run (:mod:`.run`): each search runs on a :class:`~pruning.search.TrackedObjective` view of it
   (:func:`run_searches`);
4. register (:mod:`.register`): each result becomes one :class:`~registry.records.VariantRecord`
   (:func:`variant_record`), written with its HF checkpoint (in ``pruning.json``) and registered in the
   registry (base model, then variant).

This module ties them together (:func:`prune`) and re-exports what they define, so imports from it keep
working.

**Resuming.** A run directory under ``DEPTHPRUNE_HOME/runs/`` is keyed by (model, dtype, calibration
configuration). The evaluator's memo is loaded from it at start and saved after every search and on
Ctrl-C, so re-running the same command re-scores nothing; ``bayesian`` keeps its Optuna study in an
SQLite file there (or in the ``storage`` option, e.g. a PostgreSQL URL shared by parallel workers);
checkpoints already written for the same removal set are reused.

**Accounting on a shared evaluator.** ``subset_evaluations`` counts the distinct removal sets a search
asked for (the N single-block sets included when it used the prior), independent of sharing.
``block_forwards``, ``head_positions`` (positions sent through the LM head) and ``search_seconds`` count the
work actually done while it ran, plus the shared prior's cost for searches that used the prior; a subset an
earlier search already scored is free. ``stopped_early`` counts the candidates a ranking query answered
with a lower bound (the evaluator's exact shortcuts; ``--no-shortcuts`` turns them off). The registry keeps
``shortcuts`` and ``cost`` (head positions, stopped early) in the variant's ``search_options``.

**Standalone timing** (``--timing standalone``, the study's default): the study's Table 4 is the cost of
each search run alone, so each search gets a fresh evaluator (a cold memo: nothing loaded from or saved to
the run directory, BO's Optuna study in memory) and pays for whatever it asks, the single-block prior
included, except ``fast_block_select``: as in the study (its FBS time is below one-shot's, the prior), the
prior is computed before its clock starts and not charged (``search_options["prior_charged"]``). Start-up
(model, data, dense reference pass) is never charged. ``search_options["timing"]`` records the accounting.

**Protected blocks** (``--protect first,last``): no search removes them (:class:`~pruning.search.base.
ProtectedObjective`); SLEB, PuDDing and LoRP keep the first and last block by default. Recorded in
``search_options["protected"]`` and part of the checkpoint directory's hash.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from ground.core.errors import UserError
from pruning.model.disk_space import full_disk_as_user_error, is_disk_full
from pruning.pipeline.config import TIMINGS, PruneConfig
from pruning.pipeline.heldout_selection import HeldOutCache, mark_selected
from pruning.pipeline.plan import (
    PrunePlan,
    canonical_model,
    parse_option_assignments,
    parse_searches,
    plan_prune,
    run_key,
    slug,
)
from pruning.pipeline.register import (
    SEED_INDEPENDENT_OPTIONS,
    VariantOutcome,
    register_outcome,
    variant_record,
)
from pruning.pipeline.run import (
    PRIOR_USERS,
    UNCHARGED_PRIOR,
    SearchRun,
    SearchSettings,
    run_each_alone,
    run_searches,
    run_shared,
    run_standalone,
)

if TYPE_CHECKING:  # heavy (torch, SQLAlchemy): imported where they are used
    from pruning.calibration.scoring.evaluator import SubsetEvaluator
    from registry.api import Registry

__all__ = [  # defined in .config, .plan, .run and .register; imported from here as before the split
    "PRIOR_USERS",
    "SEED_INDEPENDENT_OPTIONS",
    "TIMINGS",
    "UNCHARGED_PRIOR",
    "PruneConfig",
    "PrunePlan",
    "SearchRun",
    "SearchSettings",
    "VariantOutcome",
    "canonical_model",
    "parse_option_assignments",
    "parse_searches",
    "plan_prune",
    "prune",
    "run_key",
    "run_searches",
    "run_standalone",
    "slug",
    "variant_record",
]

OnVariant = Callable[[VariantOutcome], None]
"""Called with each variant as soon as it is registered and scored on held-out data."""


def _start_run(plan: PrunePlan, cold: bool = False) -> SubsetEvaluator:
    """The evaluator of ``plan``, with the memo of an earlier run of the same configuration loaded (not when
    ``cold``: standalone timing)."""
    from pruning.calibration.scoring.build import build_evaluator

    config = plan.config
    evaluator = build_evaluator(
        plan.model,
        config.calibration,
        dtype=config.dtype,
        device=config.device,
        memory_budget_gb=config.memory_budget_gb,
        progress=config.progress,
        shortcuts=config.shortcuts,
        batch_size=config.calibration_batch,
        gpus=config.gpus,
    )
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    (plan.run_dir / "run.json").write_text(
        json.dumps(
            {
                "model": plan.model,
                "dtype": config.dtype,
                "calibration": config.calibration.as_record(),
            },
            indent=1,
        )
    )
    if plan.memo_path.is_file() and not cold:
        evaluator.load_memo(plan.memo_path)
    return evaluator


def prune(
    config: PruneConfig, on_variant: Callable[[VariantOutcome], None] | None = None
) -> list[VariantOutcome]:
    """Run ``config``: build the evaluator, run each search, write and register each variant.

    Args:
        config: the run.
        on_variant: called with each variant as soon as it is registered and scored on held-out data
            (``selected`` is only set on the returned outcomes, once every search has run).

    Returns:
        One :class:`VariantOutcome` per search.
    """
    from registry import open_registry

    plan = plan_prune(config)
    registry = open_registry(config.registry_url)  # a bad URL fails before the model loads
    # A full disk is one line (a checkpoint names its own directory; the rest is under the run directory).
    with full_disk_as_user_error(plan.run_dir, what="run's scores and records"):
        run = _prune_standalone if config.timing == "standalone" else _prune_shared
        outcomes = run(plan, registry, HeldOutCache(config.validation, config.max_ppl_ratio), on_variant)
    mark_selected(outcomes)
    return outcomes


def _prune_shared(
    plan: PrunePlan, registry: Registry, held_out: HeldOutCache, on_variant: OnVariant | None
) -> list[VariantOutcome]:
    """``prune`` under ``--timing shared``: one evaluator whose memo is loaded, journalled as it grows (so a
    ``kill -9`` loses nothing, :mod:`pruning.calibration.scoring.memo`) and saved after each search."""
    evaluator = _start_run(plan)
    journal = evaluator.journal_memo(plan.memo_path.with_suffix(".journal"))
    outcomes: list[VariantOutcome] = []
    interrupted = True
    try:

        def record(run: SearchRun) -> None:
            evaluator.save_memo(plan.memo_path)
            journal.compact()  # memo.json holds every score now
            outcomes.append(register_outcome(registry, plan, run, evaluator, held_out))
            if on_variant is not None:
                on_variant(outcomes[-1])

        run_shared(evaluator, plan.search_settings, on_run=record)
        interrupted = False
    except Exception as error:
        # A user's mistake or a full disk is one line saying what to fix; a re-run resumes all the same.
        interrupted = not isinstance(error, UserError) and not is_disk_full(error)
        raise
    finally:
        saved = False
        try:
            evaluator.save_memo(plan.memo_path)
            saved = True
        finally:
            journal.close(delete=saved)  # kept when memo.json could not be written
        if interrupted:
            print(
                f"scores so far saved to {plan.memo_path}; run the same command again to resume",
                file=sys.stderr,
            )
    return outcomes


def _prune_standalone(
    plan: PrunePlan, registry: Registry, held_out: HeldOutCache, on_variant: OnVariant | None
) -> list[VariantOutcome]:
    """``prune`` under ``--timing standalone``: a fresh evaluator per search, no memo loaded or saved."""
    from pruning.runtime.isolation import release_device_memory

    current: dict[str, SubsetEvaluator] = {}
    outcomes: list[VariantOutcome] = []

    def cold_evaluator() -> SubsetEvaluator:
        current.clear()  # free the previous evaluator's caches before the next one fills its own
        release_device_memory()  # and hand them back to the device, so the timing starts cold
        current["evaluator"] = _start_run(plan, cold=True)
        return current["evaluator"]

    def record(run: SearchRun) -> None:
        outcomes.append(register_outcome(registry, plan, run, current["evaluator"], held_out))
        if on_variant is not None:
            on_variant(outcomes[-1])

    run_each_alone(cold_evaluator, plan.search_settings, on_run=record)
    return outcomes
