"""Planning a ``prune`` run: everything the user typed checked before any weights are loaded.

:func:`plan_prune` checks search names, options, the budget against the model's block count (read from its
config, no weights loaded) and the data spec, so that a mistake is a one-line error, and fixes the run's
directories: the run directory under ``DEPTHPRUNE_HOME/runs/`` keyed by (model, dtype, calibration
configuration) (:func:`run_key`), and each search's checkpoint directory (:meth:`PrunePlan.checkpoint_dir`).
:func:`parse_searches` and :func:`parse_option_assignments` read ``--search`` and ``--option``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ground.core import settings as depthprune_settings
from ground.core.errors import UserError
from ground.core.objectives import objective_label
from pruning.calibration.config import CalibrationConfig
from pruning.pipeline.config import PruneConfig
from pruning.pipeline.run import SearchSettings
from pruning.search import ALL_SEARCHES, OBJECTIVE_CHECKS, OPTIONS, PRIOR_GUIDED, SEARCHES
from pruning.search.base import parse_options, resolve_protected
from pruning.search.budgets import resolve_options


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

    @property
    def search_settings(self) -> SearchSettings:
        """What every search of the run is given: budget, names, seed, resolved options, protected blocks."""
        config = self.config
        return SearchSettings(
            config.drop, config.searches, config.seed, self.options, config.progress, self.protected
        )

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
