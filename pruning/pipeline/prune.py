"""The ``prune`` pipeline: calibration configuration → search(es) → pruned checkpoint(s) → registry.

``depthprune prune --model M --objective perplexity --data demo:text --drop 4 --search greedy`` runs here:

1. :func:`plan_prune` checks everything the user typed (search names, options, budget against the model's
   block count, data spec) before any weights are loaded, so a mistake is a one-line error;
2. one :class:`~pruning.calibration.scoring.evaluator.SubsetEvaluator` is built and shared by every search of
   the run (``--search all``), so the single-block prior and every memoised subset are computed once;
3. each search runs on a :class:`~pruning.search.TrackedObjective` view of it (:func:`run_searches`);
4. each result becomes one :class:`~registry.records.VariantRecord` (:func:`variant_record`), written with
   its HF checkpoint (in ``pruning.json``) and registered in the registry (base model, then variant).

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

import dataclasses
import hashlib
import json
import math
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from depthprune.core import settings as depthprune_settings
from depthprune.core.errors import UserError
from depthprune.core.objectives import objective_label
from depthprune.planning.devices import device_name
from pruning.calibration.config import CalibrationConfig
from pruning.model.disk_space import full_disk_as_user_error, is_disk_full
from pruning.pipeline.config import TIMINGS, PruneConfig  # noqa: F401 - re-exported
from pruning.pipeline.heldout_selection import HeldOutCache, mark_selected
from pruning.search import ALL_SEARCHES, OBJECTIVE_CHECKS, OPTIONS, PRIOR_GUIDED, SEARCHES, TrackedObjective
from pruning.search.base import (
    ProtectedObjective,
    SearchResult,
    SubsetObjective,
    parse_options,
    resolve_protected,
)
from pruning.search.budgets import resolve_options
from registry.records import VariantRecord

PRIOR_USERS = PRIOR_GUIDED | {"evolution"}
"""Searches that may ask for the single-block prior (evolution only with its opt-in approximate screens)."""

UNCHARGED_PRIOR = frozenset({"fast_block_select"})
"""Searches the standalone accounting gives the single-block prior for free, as the study's Table 4 does."""


@dataclass
class SearchRun:
    """One search's outcome on a (possibly shared) objective."""

    search: str
    """Search name."""
    result: SearchResult
    """What the search returned."""
    seconds: float
    """Wall time of the search (plus the shared prior's when it used it)."""
    subset_evaluations: int
    """Distinct removal sets the search asked for."""
    block_forwards: int | None
    """Evaluator block-forwards while it ran (plus the shared prior's when it used it); None without stats."""
    used_prior: bool
    """Whether it read the single-block prior."""
    head_positions: int | None = None
    """Positions the evaluator sent through the LM head while it ran (plus the shared prior's); None without
    stats."""
    stopped_early: int = 0
    """Candidates its ranking queries answered with a lower bound (scoring stopped early)."""
    prior_charged: bool = False
    """Whether ``seconds`` and ``block_forwards`` include the single-block prior's cost."""
    timing: str = "shared"
    """The accounting (:data:`TIMINGS`)."""


@dataclass
class VariantOutcome:
    """What ``prune`` reports per search (one ``--json`` line)."""

    id: int | None
    name: str | None
    search: str
    removed_blocks: list[int]
    calibration_loss: float
    dense_loss: float
    search_seconds: float
    block_forwards: int | None
    subset_evaluations: int
    checkpoint: str | None
    seed: int
    options: dict
    head_positions: int | None = None
    stopped_early: int = 0
    shortcuts: bool = True
    validation_loss: float | None = None
    fit: bool | None = None
    selected: bool = False
    quality: dict | None = None
    calibration: dict | None = None
    """The calibration record the variant was registered with (under ``--truncate`` it holds
    ``truncated_items``, the number of items cut to fit)."""


# --------------------------------------------------------------------------------------- parsing input


def parse_searches(text: str) -> tuple[str, ...]:
    """``"greedy"``, ``"greedy,beam"`` or ``"all"`` (every search but exhaustive) → names, in order."""
    names: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        expanded = ALL_SEARCHES if item == "all" else (item,)
        for name in expanded:
            if name not in SEARCHES:
                raise UserError(f"unknown search {name!r}; choose from {', '.join(SEARCHES)} or all")
            if name not in names:
                names.append(name)
    if not names:
        raise UserError("no search given; choose from " + ", ".join(SEARCHES) + " or all")
    return tuple(names)


def parse_option_assignments(assignments: list[str], searches: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """``KEY=VALUE`` (every selected search that has KEY) or ``SEARCH.KEY=VALUE`` → per-search options.

    VALUE is read as JSON when it parses (``5``, ``0.2``, ``null``), else kept as a string.
    """
    options: dict[str, dict[str, Any]] = {name: {} for name in searches}
    for assignment in assignments:
        key, equals, raw = assignment.partition("=")
        if not equals or not key.strip():
            raise UserError(f"--option must look like KEY=VALUE or SEARCH.KEY=VALUE, got {assignment!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        target, dot, name = key.strip().rpartition(".")
        if dot:
            if target not in searches:
                raise UserError(f"--option {assignment!r} names search {target!r}, which is not selected")
            targets = [target]
        else:
            targets = [search for search in searches if name in OPTIONS[search].__dataclass_fields__]
            if not targets:
                raise UserError(f"no selected search has an option {name!r} (--option {assignment!r})")
        for search in targets:
            options[search][name] = value
    return options


def slug(text: str, limit: int = 40) -> str:
    """A file-name-safe short form of a model id or path (a converted GGUF: its embedded or file name)."""
    from pruning.model.sources import read_source

    source = read_source(text) if Path(text).is_dir() else None
    text = source.label if source is not None else text
    tail = Path(text.rstrip("/")).name if Path(text).exists() else text.replace("/", "-")
    return re.sub(r"[^A-Za-z0-9._-]+", "-", tail).strip("-").lower()[:limit] or "model"


def canonical_model(model: str) -> str:
    """Local directories as absolute paths (so a run keyed by model matches from any directory).

    A GGUF file or an embedded model name (``smollm2-135m``) becomes the directory of its converted
    checkpoint (:func:`pruning.model.sources.resolve_model`), which every engine loads.
    """
    from pruning.model.sources import resolve_model

    model = resolve_model(model).model
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else model


def run_key(model: str, calibration: CalibrationConfig, dtype: str) -> str:
    """The run directory name: a hash of what the evaluator's scores depend on."""
    payload = json.dumps(
        {"model": model, "dtype": dtype, "calibration": calibration.as_record()}, sort_keys=True
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclass
class PrunePlan:
    """Everything checked and derived before the heavy work starts."""

    config: PruneConfig
    model: str
    num_blocks: int
    options: dict[str, dict[str, Any]]
    run_dir: Path
    out_dir: Path
    protected: frozenset[int] = frozenset()
    """Blocks no search removes (``--protect`` resolved against N)."""

    @property
    def memo_path(self) -> Path:
        return self.run_dir / "memo.json"

    def checkpoint_dir(self, search: str) -> Path:
        """``OUT/<model>-<objective>-m<M>-<search>-<hash>``; the hash covers calibration, seed and options."""
        calibration = self.config.calibration
        identity = json.dumps(
            {
                "model": self.model,
                "calibration": calibration.as_record(),
                "drop": self.config.drop,
                "search": search,
                "seed": self.config.seed,
                "options": self.options[search],
                # only when set, so that unprotected runs keep the directories they always had
                **({"protected": sorted(self.protected)} if self.protected else {}),
            },
            sort_keys=True,
            default=str,
        )
        digest = hashlib.sha256(identity.encode()).hexdigest()[:8]
        label = objective_label(calibration.as_record())
        name = f"{slug(self.model)}-{label}-m{self.config.drop}-{search}-{digest}"
        return self.out_dir / name


def plan_prune(config: PruneConfig) -> PrunePlan:
    """Check a run against the model's config (no weights loaded) and fix its directories and options.

    Raises:
        UserError: an impossible budget, a bad option, an unsupported or missing model.
    """
    from pruning.calibration.data.validation import check_validation_data
    from pruning.model.blocks import load_config

    model = canonical_model(config.model)
    num_blocks = int(load_config(model).num_hidden_layers)
    if config.drop >= num_blocks:
        raise UserError(
            f"cannot remove {config.drop} of {num_blocks} blocks: choose 1 <= --drop < {num_blocks}"
        )
    protected = resolve_protected(config.protect, num_blocks)
    if config.drop > num_blocks - len(protected):
        raise UserError(
            f"cannot remove {config.drop} of {num_blocks} blocks with blocks {sorted(protected)} protected: "
            f"choose --drop <= {num_blocks - len(protected)}"
        )
    run_dir = depthprune_settings.home_dir() / "runs" / run_key(model, config.calibration, config.dtype)
    options: dict[str, dict[str, Any]] = {}
    for search in config.searches:
        # a budget in subset evaluations (-o SEARCH.evaluations=E|greedy) becomes the search's own settings
        chosen = resolve_options(search, config.options.get(search, {}), num_blocks, config.drop)
        if config.random_prior and search in PRIOR_GUIDED:
            chosen["prior"] = "random"
        if search == "bayesian" and chosen.get("storage") is None and config.timing == "shared":
            # Resumable by default: the study lives next to the memo of the same configuration (a standalone
            # timing keeps it in memory: a stored study would make a re-run cost nothing).
            chosen["storage"] = f"sqlite:///{run_dir / 'optuna.db'}"
            chosen.setdefault("study_name", _bayesian_study_name(config, chosen, protected))
        parse_options(OPTIONS[search], chosen, search)  # a bad option fails now, not after loading
        options[search] = chosen
    # now, not after a minute of loading and scoring: a draw that leaves nothing to validate on
    check_validation_data(config.calibration, config.validation)
    for search in config.searches:  # now, not after the earlier searches of the run have been paid for
        if search in OBJECTIVE_CHECKS:
            OBJECTIVE_CHECKS[search](config.calibration.calibration_objective)
    if "exhaustive" in config.searches:
        limit = parse_options(OPTIONS["exhaustive"], options["exhaustive"], "exhaustive").max_subsets
        if math.comb(num_blocks, config.drop) > limit:
            raise UserError(
                f"exhaustive search would score C({num_blocks}, {config.drop}) = "
                f"{math.comb(num_blocks, config.drop):,} subsets (max_subsets={limit:,})"
            )
    out_dir = Path(config.out).expanduser() if config.out else depthprune_settings.variants_dir()
    return PrunePlan(
        config=config,
        model=model,
        num_blocks=num_blocks,
        options=options,
        run_dir=run_dir,
        out_dir=out_dir,
        protected=protected,
    )


def _bayesian_study_name(config: PruneConfig, chosen: dict, protected: frozenset[int]) -> str:
    """The Optuna study of a resumable BO run: one per M, seed, prior, prior use and protected blocks."""
    name = f"bayesian-m{config.drop}-seed{config.seed}-{chosen.get('prior', 'single_block')}"
    name += f"-{chosen.get('prior_use', 'paper')}"
    return name + (f"-protect{'.'.join(map(str, sorted(protected)))}" if protected else "")


# ------------------------------------------------------------------------------------- running searches


def _counters(objective) -> tuple[int, int] | None:
    """``(block-forwards, LM-head positions)`` of an evaluator so far; None for an objective without stats."""
    stats = getattr(objective, "stats", None)
    if stats is None:
        return None
    return int(stats.block_forwards), int(stats.head_positions)


def _difference(after, before) -> list[int] | None:
    return [late - early for late, early in zip(after, before)] if before and after else None


def _needs_full_prior(objective, name: str, options: dict) -> bool:
    """Whether search ``name`` reads every single-block loss in full (one-shot needs only its M lowest
    when the objective answers ranking queries with its shortcuts)."""
    if name not in PRIOR_USERS or options.get("prior") == "random":
        return False
    if name == "evolution":  # only its approximate screens read the prior (EvoPress itself never does)
        return options.get("screen") in ("mixed", "prior")
    return not (name == "one_shot" and getattr(objective, "shortcuts", False))


def run_searches(
    objective: SubsetObjective,
    budget: int,
    searches: tuple[str, ...],
    *,
    seed: int = 0,
    options: dict[str, dict[str, Any]] | None = None,
    progress: bool = True,
    on_run: Callable[[SearchRun], None] | None = None,
    protected: frozenset[int] = frozenset(),
    charge_prior: bool = True,
) -> list[SearchRun]:
    """Run several searches on one shared objective, computing the single-block prior once.

    Args:
        objective: the shared evaluator (or any SubsetObjective; ``stats`` is read when present).
        budget: M.
        searches: names in ``SEARCHES``, run in order.
        seed: seed of every search.
        options: per search name, its options.
        progress: show progress bars.
        on_run: called after each search (e.g. to save the memo and write the checkpoint).
        protected: blocks no search may remove (each search sees a :class:`ProtectedObjective`).
        charge_prior: add the prior's cost to the searches that read it.

    Returns:
        One :class:`SearchRun` per search.
    """
    options = options or {}
    prior_seconds, prior_counts = 0.0, [0, 0]
    if any(_needs_full_prior(objective, name, options.get(name, {})) for name in searches):
        before, started = _counters(objective), time.perf_counter()
        objective.single_block_scores()
        prior_seconds = time.perf_counter() - started
        prior_counts = _difference(_counters(objective), before) or prior_counts
    runs = []
    for name in searches:
        tracked = TrackedObjective(objective)
        # Outside the tracker, so that it counts only the sets actually scored.
        searched = ProtectedObjective(tracked, protected) if protected else tracked
        before, started = _counters(objective), time.perf_counter()
        result = SEARCHES[name](searched, budget, seed=seed, progress=progress, **options.get(name, {}))
        seconds = time.perf_counter() - started
        counts = _difference(_counters(objective), before)
        if tracked.used_prior and charge_prior:
            seconds += prior_seconds
            counts = [count + prior for count, prior in zip(counts, prior_counts)] if counts else None
        run = SearchRun(
            search=name,
            result=result,
            seconds=seconds,
            subset_evaluations=tracked.subset_evaluations,
            block_forwards=counts[0] if counts else None,
            used_prior=tracked.used_prior,
            head_positions=counts[1] if counts else None,
            stopped_early=tracked.stopped_early,
            prior_charged=tracked.used_prior and charge_prior,
        )
        runs.append(run)
        if on_run is not None:
            on_run(run)
    return runs


def run_standalone(
    cold_objective: Callable[[], SubsetObjective],
    budget: int,
    searches: tuple[str, ...],
    *,
    seed: int = 0,
    options: dict[str, dict[str, Any]] | None = None,
    progress: bool = True,
    on_run: Callable[[SearchRun], None] | None = None,
    protected: frozenset[int] = frozenset(),
) -> list[SearchRun]:
    """Run each search alone on a fresh objective: the study's accounting of search cost (Table 4).

    Every search pays for what it asks, the single-block prior included, except those in
    :data:`UNCHARGED_PRIOR`, which get the prior computed before their clock starts.

    Args:
        cold_objective: makes a fresh objective (a cold memo) per search.
        budget, searches, seed, options, progress, on_run, protected: as :func:`run_searches`.

    Returns:
        One :class:`SearchRun` per search, ``timing="standalone"``.
    """
    options = options or {}
    runs = []
    for name in searches:
        objective = cold_objective()
        charged = name not in UNCHARGED_PRIOR
        if not charged:
            objective.single_block_scores()  # before the clock: the study does not charge it
        (run,) = run_searches(
            objective,
            budget,
            (name,),
            seed=seed,
            options=options,
            progress=progress,
            protected=protected,
            charge_prior=charged,
        )
        run.timing = "standalone"
        runs.append(run)
        if on_run is not None:
            on_run(run)
    return runs


# ------------------------------------------------------------------------------------------- the command


def variant_record(
    plan: PrunePlan, run: SearchRun, dense_loss: float, quality: dict | None = None, truncated: int = 0
) -> VariantRecord:
    """The registry record of one search's variant (its checkpoint not yet written)."""
    calibration = plan.config.calibration.as_record()
    if plan.config.calibration.truncate:
        calibration["truncated_items"] = truncated
    return VariantRecord(
        base_model=plan.model,
        removed_blocks=list(run.result.removed_blocks),
        calibration=calibration,
        quality=quality,
        search=run.search,
        search_options={
            **run.result.options,
            "seed": plan.config.seed,
            "shortcuts": plan.config.shortcuts,
            "cost": {
                "head_positions": run.head_positions,
                "stopped_early": run.stopped_early,
                "device": device_name(plan.config.device, plan.config.gpus),
            },
            "timing": run.timing,
            "prior_charged": run.prior_charged,
            **({"protected": sorted(plan.protected)} if plan.protected else {}),
        },
        calibration_loss=run.result.loss,
        dense_loss=dense_loss,
        search_seconds=run.seconds,
        block_forwards=run.block_forwards,
        subset_evaluations=run.subset_evaluations,
    )


def _checkpoint_for(plan: PrunePlan, search: str, record: VariantRecord):
    """Write (or reuse, when it already holds this removal set) the checkpoint of one search."""
    from pruning.model.checkpoint import reusable_checkpoint, write_pruned_checkpoint

    directory = plan.checkpoint_dir(search)
    overwrite = plan.config.overwrite
    if not overwrite:
        existing, overwrite = reusable_checkpoint(directory, record.removed_blocks)
        if existing is not None:
            return existing  # a resumed run: the same search already wrote this variant
    return write_pruned_checkpoint(
        plan.model, record.removed_blocks, directory, variant=record, overwrite=overwrite
    )


SEED_INDEPENDENT_OPTIONS = ("prior", "timing", "protected")
"""Search options that must agree for two runs with different seeds to be the same variant's runs."""


def _with_earlier_seeds(registry, record: VariantRecord) -> dict:
    """``record``'s search options with ``seeds``: every seed that produced this variant.

    The registry keeps one row per (base, removed set, calibration, search), so a search that finds the same
    mask under seeds 0, 1 and 2 (any deterministic search) is one variant whose ``seed`` is the latest run's;
    ``seeds`` keeps the earlier ones, so that a study finds the cell of each seed in the registry."""
    options = dict(record.search_options)
    seeds = {options["seed"]}
    try:
        earlier = registry.list_variants(record.base_model)
    except UserError:  # the base model is new: no earlier run
        earlier = []
    for variant in earlier:
        found = variant.search_options or {}
        if (
            variant.search == record.search
            and variant.removed_blocks == record.removed_blocks
            and variant.calibration == record.calibration
            and all(found.get(key) == options.get(key) for key in SEED_INDEPENDENT_OPTIONS)
        ):
            seeds.update(found.get("seeds", [found.get("seed")]))
    options["seeds"] = sorted(seed for seed in seeds if seed is not None)
    return options


def _register(registry, plan: PrunePlan, run: SearchRun, evaluator, held_out) -> VariantOutcome:
    """Score one search's outcome on held-out data, write its checkpoint and register it (base model, then
    variant)."""
    dense_loss = evaluator.dense_loss()
    quality = held_out(evaluator).quality(run.result.removed_blocks)
    record = variant_record(plan, run, dense_loss, quality, evaluator.truncated_items)
    record = dataclasses.replace(record, search_options=_with_earlier_seeds(registry, record))
    written = _checkpoint_for(plan, run.search, record)
    registry.register_base_model(
        plan.model,
        revision=written.base_revision,
        weights_sha256=written.base_weights_sha256,
        num_blocks=plan.num_blocks,
        architecture=written.architecture,
    )
    # The run's own numbers, also when an earlier run wrote the checkpoint (its pruning.json keeps its own).
    record = dataclasses.replace(
        record,
        checkpoint_path=written.path,
        checkpoint_sha256=written.weights_sha256,
    )
    variant = registry.register_variant(record)
    return VariantOutcome(
        id=variant.id,
        name=variant.name,
        search=run.search,
        removed_blocks=record.removed_blocks,
        calibration_loss=run.result.loss,
        dense_loss=dense_loss,
        search_seconds=round(run.seconds, 3),
        block_forwards=run.block_forwards,
        subset_evaluations=run.subset_evaluations,
        checkpoint=written.path,
        seed=plan.config.seed,
        options=record.search_options,
        head_positions=run.head_positions,
        stopped_early=run.stopped_early,
        shortcuts=plan.config.shortcuts,
        validation_loss=quality["validation_loss"],
        fit=quality["fit"],
        quality=quality,
        calibration=record.calibration,
    )


def _start_run(plan: PrunePlan, cold: bool = False):
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


def _prune_shared(plan: PrunePlan, registry, held_out, on_variant) -> list[VariantOutcome]:
    """``prune`` under ``--timing shared``: one evaluator whose memo is loaded, journalled as it grows (so a
    ``kill -9`` loses nothing, :mod:`pruning.calibration.scoring.memo`) and saved after each search."""
    config = plan.config
    evaluator = _start_run(plan)
    journal = evaluator.journal_memo(plan.memo_path.with_suffix(".journal"))
    outcomes: list[VariantOutcome] = []
    interrupted = True
    try:

        def record(run: SearchRun) -> None:
            evaluator.save_memo(plan.memo_path)
            journal.compact()  # memo.json holds every score now
            outcomes.append(_register(registry, plan, run, evaluator, held_out))
            if on_variant is not None:
                on_variant(outcomes[-1])

        run_searches(
            evaluator,
            config.drop,
            config.searches,
            seed=config.seed,
            options=plan.options,
            progress=config.progress,
            on_run=record,
            protected=plan.protected,
        )
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


def _prune_standalone(plan: PrunePlan, registry, held_out, on_variant) -> list[VariantOutcome]:
    """``prune`` under ``--timing standalone``: a fresh evaluator per search, no memo loaded or saved."""
    from pruning.runtime.isolation import release_device_memory

    current: dict[str, Any] = {}
    outcomes: list[VariantOutcome] = []

    def cold_evaluator():
        current.clear()  # free the previous evaluator's caches before the next one fills its own
        release_device_memory()  # and hand them back to the device, so the timing starts cold
        current["evaluator"] = _start_run(plan, cold=True)
        return current["evaluator"]

    def record(run: SearchRun) -> None:
        outcomes.append(_register(registry, plan, run, current["evaluator"], held_out))
        if on_variant is not None:
            on_variant(outcomes[-1])

    config = plan.config
    run_standalone(
        cold_evaluator,
        config.drop,
        config.searches,
        seed=config.seed,
        options=plan.options,
        progress=config.progress,
        on_run=record,
        protected=plan.protected,
    )
    return outcomes
