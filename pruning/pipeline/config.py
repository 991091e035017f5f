"""The configuration of one ``prune`` run (:class:`PruneConfig`), checked as it is built.

Re-exported by :mod:`pruning.pipeline.prune` and :mod:`pruning.pipeline`. :func:`prune_config_from` is the
one place a PruneConfig is built (the command line, study cells, the demo, the benchmarks); the fields with
``cli`` metadata are also ``depthprune prune``'s options (:mod:`ground.core.cli_options`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ground.core.cli_options import cli, option_arguments
from ground.core.errors import UserError
from ground.core.fitness import DEFAULT_MAX_PPL_RATIO
from pruning.calibration.config import CalibrationConfig
from pruning.search import PRIOR_GUIDED, SEARCHES

TIMINGS = ("shared", "standalone")
"""``--timing``: ``shared``, every search on one evaluator (marginal costs: a subset or prior an earlier
search computed is free, the prior charged to each search that reads it); ``standalone``, each search on a
fresh evaluator, the study's accounting (module doc)."""


@dataclass
class PruneConfig:
    """One ``prune`` run: a calibration configuration, a budget, and the searches to run on it."""

    model: str
    """Hub id, local directory, ``PATH.gguf`` or embedded model name (``smollm2-135m``) of the dense model."""
    calibration: CalibrationConfig
    """What the searches minimise, on which data."""
    drop: int = field(metadata=cli())
    """M, the number of blocks to remove."""
    searches: tuple[str, ...]
    """Search names (keys of ``pruning.search.SEARCHES``), run in this order on one shared evaluator."""
    seed: int = field(default=0, metadata=cli(help="Seed of the search(es)."))
    """Seed of every search."""
    random_prior: bool = field(
        default=False,
        metadata=cli(
            "--random-prior",
            help="Replace the single-block prior of the prior-guided searches (one_shot, genetic, bayesian, "
            "fast_block_select) by a seeded random ranking (control).",
        ),
    )
    """Replace the single-block prior by a seeded random ranking in the prior-guided searches (control)."""
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per search name, options for it (see each search's ``Options``)."""
    out: Path | None = None
    """Parent directory of the checkpoints; None = ``DEPTHPRUNE_HOME/variants``."""
    registry_url: str | None = None
    """Registry URL; None = the default (``DEPTHPRUNE_REGISTRY_URL`` or SQLite under DEPTHPRUNE_HOME)."""
    dtype: str = "float32"
    """dtype the evaluator runs the model in."""
    device: str = "cpu"
    """torch device of the evaluator (with ``gpus`` above 1: the first card)."""
    gpus: int = 1
    """Cards the model is spread over (device_map placed by the memory planner); 1 = all on ``device``."""
    memory_budget_gb: float | None = None
    """Memory the evaluator's boundary cache may use; None = its default."""
    calibration_batch: int = 8
    """Calibration sequences per forward (the memory plan lowers it on a small GPU; values do not change)."""
    overwrite: bool = field(
        default=False,
        metadata=cli(help="Replace a checkpoint directory of this run that holds a different removal set."),
    )
    """Replace an existing checkpoint directory that holds a different removal set."""
    progress: bool = True
    """Show progress bars (on stderr)."""
    shortcuts: bool = field(
        default=True,
        metadata=cli(
            "--shortcuts/--no-shortcuts",
            help="The evaluator's exact shortcuts (cached base boundaries, shared prefixes, early-stopped "
            "rankings); --no-shortcuts scores every candidate in full, to check that nothing changes.",
        ),
    )
    """The evaluator's exact shortcuts (cached base boundaries, shared prefixes, lower bounds that stop
    hopeless candidates); False scores every candidate in full from the dense boundaries, to check that
    the selections and losses are the same."""
    timing: str = "shared"
    """How search costs are accounted: ``shared`` or ``standalone`` (:data:`TIMINGS`)."""
    protect: tuple[str, ...] = ()
    """Blocks no search may remove: ``first``, ``last`` or block indices; empty = none."""
    validation: str | None = field(
        default=None,
        metadata=cli(
            metavar="SPEC",
            help="Held-out data of the objective's kind on which every search's outcome is scored to select "
            "one (mc:PATH, text:PATH, any data spec). Default: the calibration source's calibration split "
            "minus the calibration draw (docs/objectives.md).",
        ),
    )
    """Held-out data every outcome is scored on (``validation_loss``, ``selected``); None = the calibration
    source's held-out part (:mod:`pruning.calibration.data.validation`)."""
    max_ppl_ratio: float = field(
        default=DEFAULT_MAX_PPL_RATIO,
        metadata=cli(
            metavar="K",
            help="Quality gate: a variant whose held-out perplexity exceeds K x the dense model's is fit: "
            "false (as is one whose task accuracy falls to chance).",
        ),
    )
    """Quality gate's K: held-out perplexity above K x dense makes a variant unfit
    (:mod:`pruning.pipeline.heldout`).
    """

    def __post_init__(self):
        if self.timing not in TIMINGS:
            raise UserError(f"--timing must be one of {', '.join(TIMINGS)}, got {self.timing!r}")
        self.protect = tuple(str(item).strip() for item in self.protect if str(item).strip())
        if not isinstance(self.calibration, CalibrationConfig):
            raise TypeError("calibration must be a CalibrationConfig")
        if not self.searches:
            raise UserError("no search given")
        unknown = [name for name in self.searches if name not in SEARCHES]
        if unknown:
            raise UserError(f"unknown search {unknown[0]!r}; choose from {', '.join(SEARCHES)} or all")
        if isinstance(self.drop, bool) or not isinstance(self.drop, int) or self.drop < 1:
            raise UserError(f"--drop must be a positive integer, got {self.drop!r}")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 1:
            raise UserError(f"--gpus must be a positive integer, got {self.gpus!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise UserError(f"--seed must be a non-negative integer, got {self.seed!r}")
        if self.random_prior and not PRIOR_GUIDED & set(self.searches):
            guided = ", ".join(sorted(PRIOR_GUIDED))
            raise UserError(
                f"--random-prior applies to the prior-guided searches ({guided}), none of which was selected"
            )


def prune_config_from(values: Mapping[str, Any] | None = None, /, **fields: Any) -> PruneConfig:
    """The one place a :class:`PruneConfig` is built: from ``prune``'s typed option values of its fields
    (``values``, by field name: ``OptionValues[PruneConfig]``) and ``fields``, every other field by name (they
    win). Study cells, the demo and the benchmarks give ``fields`` only."""
    return PruneConfig(**{**option_arguments(PruneConfig, values or {}), **fields})
