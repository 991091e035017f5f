"""The option groups of the pruning commands (``checkpoint``, ``prune``, ``heal``, ``eval``, ``study``,
``bench-evaluator``, ``data show``), each option declared once (:mod:`ground.core.cli_options`).

A group several commands share is here; a command whose option reads differently (``study --checkpoints``
for ``prune --out``, ``bench-evaluator``'s default objective) changes it with an ``Override`` where it takes
the group. The options that fill :class:`~pruning.pipeline.config.PruneConfig` and
:class:`~pruning.healing.config.HealConfig` directly are declared on those fields. Nothing heavy is imported:
``depthprune --help`` reads this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ground.core.cli_options import cli, option_group
from ground.core.objectives import OBJECTIVES, objectives_help
from pruning.search import SEARCHES, STUDY_SEARCHES

_CLIPPED = ", ".join(name for name, objective in OBJECTIVES.items() if "margin_clip" in objective.parameters)


@option_group
@dataclass(frozen=True)
class ModelOptions:
    """The dense model a command starts from."""

    model: str
    """The dense model: hub id, local directory, a .gguf file, or smollm2-135m (the embedded
    SmolLM2-135M-Instruct)."""


@option_group
@dataclass(frozen=True)
class ObjectiveOptions:
    """One calibration objective and its sample count (``prune``, ``bench-evaluator``)."""

    objective: str = field(metadata=cli(help=f"Calibration objective: {objectives_help()}."))
    """One calibration objective (the help lists :data:`~ground.core.objectives.OBJECTIVES`)."""
    samples: int = 64
    """Calibration samples (text windows or questions)."""


@option_group
@dataclass(frozen=True)
class PruneCalibrationOptions:
    """The rest of ``prune``'s calibration configuration (:class:`~pruning.calibration.config.
    CalibrationConfig`)."""

    data: str
    """Calibration data: c4, wikitext2, lambada, commonsense170k[:PATH], demo:text, demo:qa, text:PATH or
    mc:PATH (its kind must suit the objective; 'depthprune data show' prints it)."""
    seq_len: int = 2048
    """Tokens per calibration window."""
    data_seed: int = 0
    """Seed of the calibration sample draw."""
    kl_weight: float = field(default=0.0, metadata=cli(metavar="LAMBDA"))
    """Add LAMBDA x KL(dense || pruned) on the same sequences to the objective (multiple choice: over the
    prompt and answer positions). Recorded in the calibration configuration and the variant's name."""


@option_group
@dataclass(frozen=True)
class SamplingOptions:
    """How text calibration instances are cut (``prune``, ``study``, ``data show``)."""

    sampling: str = "documents"
    """Text instances: documents (one document each, truncated to --seq-len; shorter ones skipped, the
    study's way) or stream (windows cut from all documents joined)."""


@option_group
@dataclass(frozen=True)
class ItemOptions:
    """How an objective treats its items: long multiple-choice items, the margin's clip (``prune``,
    ``study``)."""

    truncate: bool = field(default=False, metadata=cli("--truncate"))
    """Cut multiple-choice items longer than --seq-len from the left (recorded as truncated_items) instead of
    refusing them."""
    margin_clip: float | None = field(
        default=None,
        metadata=cli(
            metavar="TAU",
            help=f"{_CLIPPED}: clip each item's margin to [-TAU, TAU] (a bounded margin; default: PuDDing's "
            "unbounded one). Recorded in the calibration configuration and the variant's name.",
        ),
    )
    """Clip the per-item margin of the objectives that have one (the help names them)."""


@option_group
@dataclass(frozen=True)
class SearchScopeOptions:
    """What every search of a run may remove and how its cost is counted (``prune``, ``study``)."""

    protect: str | None = None
    """Blocks no search may remove, comma-separated: first, last or block indices (SLEB, PuDDing and LoRP
    keep first,last). Default: none."""
    timing: str = "shared"
    """Search-cost accounting: standalone (each search alone on a cold memo, the study's Table 4;
    fast_block_select not charged the prior) or shared (one memoised evaluator for all searches: marginal
    costs)."""


@option_group
@dataclass(frozen=True)
class PruneSearchOptions:
    """``prune``'s searches and their settings."""

    search: str = field(
        default="greedy",
        metadata=cli(
            help=f"Search algorithm: {', '.join(SEARCHES)}; comma-separated for several, or 'all' (every one "
            "but exhaustive) on one shared evaluator."
        ),
    )
    """The searches to run (the help lists :data:`pruning.search.SEARCHES`)."""
    option: list[str] | None = field(default=None, metadata=cli("--option", "-o"))
    """Search option KEY=VALUE (every selected search that has it) or SEARCH.KEY=VALUE, e.g. -o
    beam.width=3 -o bayesian.trials=50 -o bayesian.storage=postgresql+psycopg://host/db. Repeatable."""


@option_group
@dataclass(frozen=True)
class CheckpointsOptions:
    """Where pruned (and healed) checkpoints are written (``prune --out``, ``heal --out``, ``study
    --checkpoints``)."""

    out: Path | None = None
    """Parent directory of the pruned checkpoints (default: DEPTHPRUNE_HOME/variants)."""


@option_group
@dataclass(frozen=True)
class MemoryBudgetOptions:
    """Memory of the subset scorer's boundary cache (``prune``, ``bench-evaluator``)."""

    memory_budget_gb: float | None = None
    """Memory the evaluator's cache of block-boundary hidden states may use (default: a share of what is
    free)."""


@option_group
@dataclass(frozen=True)
class RepairOptions:
    """``prune --heal``: repair the selected variant right after the search (:mod:`pruning.cli.repair`)."""

    heal: str | None = field(default=None, metadata=cli("--heal"))
    """patch: repair the selected variant right after the search (heal --method patch, its defaults) and
    register both, the patched one as the selected one's child."""
    heal_data: str | None = field(default=None, metadata=cli(metavar="SPEC"))
    """With --heal: text the patch is estimated on (default: the calibration data)."""


@option_group
@dataclass(frozen=True)
class EvaluationOptions:
    """What an evaluation reads (``eval``; ``study`` names them ``--eval-limit`` ...)."""

    suite: str = "all"
    """perplexity (WikiText-2, C4, LAMBADA), zero-shot (HellaSwag, WinoGrande, ARC-E/C, PIQA, BoolQ), demo
    (the demo model's local text perplexity and QA accuracy), offline (real text and questions that need no
    network), all (demo suites on a demo model, else perplexity + zero-shot), or your own files: text:PATH
    (perplexity) and mc:PATH (accuracy), the formats prune --data takes; comma-separated for several."""
    limit: int | None = None
    """At most N perplexity windows / N documents per task (quick checks; recorded)."""
    windows: int | None = None
    """At most N perplexity windows per task, apart from the item limit (default: the limit)."""
    seq_len: int = 2048
    """Perplexity window length in tokens (non-overlapping; capped at the model's context)."""


@option_group
@dataclass(frozen=True)
class EvalOptions:
    """``eval``'s own options."""

    engine: str = "auto"
    """auto (vLLM when installed, else transformers), vllm, or hf (plain torch forward)."""
    num_fewshot: int = 0
    """Few-shot examples for lm-eval tasks (the study: 0)."""
    no_record: bool = field(default=False, metadata=cli("--no-record"))
    """Do not store the results in the registry."""


@option_group
@dataclass(frozen=True)
class CheckpointOptions:
    """``checkpoint``: which blocks go, where the checkpoint is written, in which dtype."""

    remove: str
    """Original indices of the blocks to remove, e.g. 3,7,8."""
    out: Path
    """Directory to write the pruned checkpoint to."""
    revision: str | None = None
    """Hub revision of the model."""
    dtype: str | None = None
    """Save in this dtype (default: the model's own)."""
    overwrite: bool = False
    """Replace OUT if it exists."""


@option_group
@dataclass(frozen=True)
class StudyGridOptions:
    """The ``study`` options that span its grid."""

    drop: str
    """Budgets M (blocks removed), comma-separated, e.g. 4,6."""
    objectives: str = "perplexity,task_margin"
    """Calibration objectives, comma-separated: perplexity, task_margin, kl."""
    searches: str = field(
        default="study",
        metadata=cli(
            help="Searches, comma-separated: names, 'study' (the paper's seven: "
            f"{', '.join(STUDY_SEARCHES)}) or 'all' (the seven and the structural baselines block_influence, "
            "lorp, streamline); mixable."
        ),
    )
    """The searches of every cell (the help lists :data:`pruning.search.STUDY_SEARCHES`)."""
    data: str | None = None
    """Calibration data specs, comma-separated; each objective uses the first of its kind (text or
    multiple-choice). Default: the demo data for the demo model, else c4 and commonsense170k."""
    seeds: str = "0"
    """Seeds, comma-separated, e.g. 0,1,2: each draws its own calibration samples."""
    data_seed: int | None = None
    """Pin the calibration draw to this seed for every seed: the seeds then vary the search only, and a
    deterministic search runs once (its other seeds' cells record reused_from)."""
    random_prior_control: bool = field(default=False, metadata=cli("--random-prior-control"))
    """Also run the prior-guided searches with a seeded random prior."""
    cross_controls: bool = field(default=False, metadata=cli("--cross-controls"))
    """Run every objective on every --data source of its kind."""


@option_group
@dataclass(frozen=True)
class StudyCalibrationOptions:
    """The ``study`` options that shape each calibration sample (with :class:`SamplingOptions` and
    :class:`ItemOptions`)."""

    samples: int = 64
    """Calibration samples per configuration."""
    seq_len: int | None = None
    """Calibration tokens per window (default: min(2048, the model's context))."""
    choice_seq_len: int | None = None
    """Multiple-choice objectives: the longest question plus answer (longer prompts are cut); default
    --seq-len. Above the longest item no question is truncated."""


@option_group
@dataclass(frozen=True)
class StudyRunOptions:
    """How ``study`` searches, evaluates, heals, reports and shares its grid."""

    option: list[str] | None = field(default=None, metadata=cli("--option", "-o"))
    """Search option SEARCH.KEY=VALUE or KEY=VALUE, as for prune. Repeatable."""
    engine: str = "auto"
    """Evaluation engine: auto, vllm or torch."""
    heal_spec: str | None = field(default=None, metadata=cli("--heal"))
    """Heal every distinct mask with METHOD:STEPS (lora:200 or distill:200; heal's other defaults) and report
    whether the search or the calibration still matters after healing."""
    heal_data: str | None = None
    """With --heal: text to heal on (its heal split, else its calibration split; never a test split).
    Default: the study's text calibration data."""
    out: Path = Path("study")
    """Report directory (Markdown, HTML, figures, study.json)."""
    worker: bool = field(default=False, metadata=cli("--worker"))
    """Be one of several workers (same arguments, same --registry) sharing the grid: claim cells one at a
    time from the registry's work queue; every worker writes the report once all are done."""
    lease_seconds: float = 120.0
    """With --worker: a killed worker's cell is taken over after this many seconds."""
    workers_per_gpu: int = 1
    """With --worker on CUDA: worker processes sharing one card (start that many); each plans its cells'
    memory for its 1/N share of the card instead of the whole card."""
    keep_weights: str = "all"
    """all: every variant keeps its weights. none: a variant's weight files are deleted once its evaluation
    is recorded (the directory keeps its pruning.json and the command that writes them again), for grids
    whose checkpoints would not fit on disk."""
    executor: str = "local"
    """local (this process, or --worker's shared queue) or ray (one Ray task per cell; needs
    depthprune[ray])."""
    ray_address: str | None = None
    """With --executor ray: the cluster to use (HOST:PORT); default: start a local one."""


@option_group
@dataclass(frozen=True)
class BenchOptions:
    """``bench-evaluator``'s own options."""

    model: str | None = None
    """smollm2-135m, a .gguf file, a model directory or hub id (default: the demo model, built on first
    use)."""
    data: str | None = None
    """Data spec (default: the demo model's demo:qa or demo:text, as the objective needs)."""
    seq_len: int = 128
    """Tokens per text window / longest question."""
    budget: int = 4
    """Blocks removed in each random set (M)."""
    random_sets: int = 100
    """Random M-block sets scored after the single ones."""
    batch_size: int = 16
    """Sequences per forward."""
    repeats: int = 1
    """Interleaved rounds of each side (fast, naive, then naive, fast, ...); times are medians."""
    pack: bool = True
    """Fast side: run each question's choices as one sequence sharing the prompt."""


@option_group
@dataclass(frozen=True)
class DataShowOptions:
    """``data show``: the tokenizer and the draw."""

    model: str
    """Model whose tokenizer encodes the data (hub id, directory, .gguf, embedded name)."""
    samples: int = 64
    """Instances to draw (text instances or questions)."""
    seq_len: int = 2048
    """Tokens per text instance; longest prompt plus answer."""
    data_seed: int = 0
    """Seed of the draw (as prune --data-seed)."""
    split: str = "calibration"
    """Split: calibration, heal or test."""
