"""Planning the study: the grid of (calibration, budget, search, seed) cells, checked before any weights load.

``depthprune study --model M --drop 4,6 --objectives perplexity,task_margin --searches study`` plans here
(``--searches`` takes ``study``, the paper's seven, ``all``, those and the structural baselines, or names;
:func:`study_searches`). :func:`plan_study` expands the grid and checks every cell (objective/data kinds,
budgets, search options, ``--heal`` options) before any weights are loaded; :func:`plan_summary` is what the
report says about the setup.

Options beyond the study itself: several ``--seeds``; ``--random-prior-control`` re-runs the prior-guided
searches with a seeded random prior; ``--cross-controls`` runs every objective on every data source of its
kind given with ``--data`` (so objective and data are varied separately, which the study could not afford).

The rest of the study, by job: :mod:`.cells` (run and evaluate the cells, the manifest), :mod:`.run`
(``run_study``), :mod:`.healing`, :mod:`.worker`, :mod:`.tables`, :mod:`.figures`, :mod:`.report`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ground.core.errors import UserError

DEFAULT_DATA = {"text": "c4", "multiple_choice": "commonsense170k"}
"""Calibration data per data kind for a hub model (the study's C4 and Commonsense-170k)."""

STUDY_BASELINES = ("block_influence", "lorp", "streamline")
"""What ``--searches all`` adds to the paper's seven: the structural baselines (ShortGPT's Block Influence,
LoRP, LLM-Streamline), which choose from hidden-state similarity and never look at the calibration loss."""


def study_searches(text: str) -> tuple[str, ...]:
    """``--searches``: ``study`` (the paper's seven, so every per-cell statistic is over n = 7), ``all`` (the
    seven and :data:`STUDY_BASELINES`), or names, comma-separated and mixable (``study,evolution``).

    Raises:
        UserError: an unknown name, or none.
    """
    from pruning.search import SEARCHES, STUDY_SEARCHES

    groups = {"study": STUDY_SEARCHES, "all": STUDY_SEARCHES + STUDY_BASELINES}
    names: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        for name in groups.get(item, (item,) if item else ()):
            if name not in SEARCHES:
                raise UserError(f"unknown search {name!r}; choose from {', '.join(SEARCHES)}, study or all")
            if name not in names:
                names.append(name)
    if not names:
        raise UserError("no search given; name searches, or 'study' (the paper's seven) or 'all'")
    return tuple(names)


STUDY_HEAL_METHODS = ("lora", "distill")
"""``--heal`` methods: those of :data:`pruning.healing.config.METHODS`."""

STUDY_HEAL_MAX_SEQ_LEN = 512
"""Healing windows: ``heal``'s default length, or the study's ``--seq-len`` when that is shorter."""


@dataclass(frozen=True)
class HealOption:
    """A parsed ``--heal METHOD:STEPS``."""

    method: str
    """``lora`` or ``distill``."""
    steps: int
    """Optimizer steps per healed variant."""


def parse_heal_option(text: str) -> HealOption:
    """``lora:200`` -> ``HealOption("lora", 200)``.

    Raises:
        UserError: not ``METHOD:STEPS``, an unknown method, or steps that are not a positive integer.
    """
    method, separator, steps = str(text).strip().partition(":")
    if not separator or method not in STUDY_HEAL_METHODS:
        raise UserError(
            f"--heal takes METHOD:STEPS with METHOD one of {', '.join(STUDY_HEAL_METHODS)}, e.g. lora:200; "
            f"got {text!r}"
        )
    if not steps.strip().isdigit() or int(steps) < 1:
        raise UserError(f"--heal {text!r}: STEPS must be a positive integer, e.g. {method}:200")
    return HealOption(method, int(steps))


def check_heal_options(config) -> None:
    """Check ``--heal`` and ``--heal-data`` of a :class:`~pruning.study.plan.StudyConfig`.

    Raises:
        UserError: a malformed ``--heal``, ``--heal-data`` without ``--heal`` or not text, or ``--worker``.
    """
    if config.heal is None:
        if config.heal_data is not None:
            raise UserError("--heal-data needs --heal METHOD:STEPS")
        return
    parse_heal_option(config.heal)
    if config.heal_data is not None:
        from pruning.calibration.data.items import TEXT
        from pruning.calibration.data.specs import parse_spec

        if parse_spec(config.heal_data).kind != TEXT:
            raise UserError(
                f"--heal-data {config.heal_data!r} is multiple-choice data; healing trains on text"
            )
    if config.worker:
        raise UserError(
            "--heal does not run in --worker mode: let the workers finish, then run the same study without "
            "--worker and with --heal; it finds every cell in the registry and heals the masks"
        )


# ------------------------------------------------------------------------------------------------ healing


KEEP_WEIGHTS = ("all", "none")
"""``study --keep-weights`` values."""


@dataclass
class StudyConfig:
    """One study: the grid, how to evaluate, where to write."""

    model: str
    """Hub id or local directory of the dense model."""
    drops: tuple[int, ...]
    """Budgets M (blocks removed)."""
    objectives: tuple[str, ...] = ("perplexity", "task_margin")
    """Calibration objectives (keys of ``ground.core.objectives.OBJECTIVES``)."""
    searches: tuple[str, ...] = ()
    """Search names; empty = the study's seven (``pruning.search.STUDY_SEARCHES``)."""
    data: tuple[str, ...] = ()
    """Calibration data specs; empty = demo data for the demo model, else C4 / Commonsense-170k. Each
    objective uses the first spec of its kind (every spec of its kind with ``cross_controls``)."""
    seeds: tuple[int, ...] = (0,)
    """Seeds; each cell runs once per seed, and the seed also draws the calibration samples (data seed =
    seed) unless ``data_seed`` pins the draw."""
    data_seed: int | None = None
    """Pin the calibration draw to this data seed for every seed (``--data-seed``): then the seeds vary the
    search only, and a deterministic search (:data:`pruning.search.DETERMINISTIC`) runs under the first
    seed alone, its other seeds' cells copying that cell (``reused_from``). None: each seed draws its own."""
    random_prior_control: bool = False
    """Also run the prior-guided searches with a seeded random prior instead of the single-block scores."""
    cross_controls: bool = False
    """Run every objective on every data source of its kind."""
    samples: int = 64
    """Calibration samples per configuration (the study: 64)."""
    seq_len: int | None = None
    """Calibration tokens per instance; None = min(2048, the model's context)."""
    choice_seq_len: int | None = None
    """Multiple-choice objectives only: the longest a question plus answer may be (longer prompts lose their
    beginning); None = ``seq_len``. Their cost follows the items' own lengths, so a cap above the longest
    item keeps every question whole while text instances stay ``seq_len`` tokens."""
    sampling: str = "documents"
    """Text calibration instances: ``documents`` (one document each, the study's) or ``stream`` windows."""
    truncate: bool = False
    """Cut multiple-choice items longer than ``seq_len`` (``--truncate``) instead of refusing them."""
    margin_clip: float | None = None
    """``task_margin`` only: clip each item's margin to [-TAU, TAU] (``--margin-clip TAU``); the objectives
    without the parameter are unaffected. None: PuDDing's unbounded margin."""
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per search name, search options (as ``prune --option``)."""
    suites: tuple[str, ...] = ("all",)
    """Evaluation suites (see :mod:`pruning.evaluation.suites`)."""
    engine: str = "auto"
    """Evaluation engine: ``auto``, ``vllm`` or ``torch``."""
    eval_limit: int | None = None
    """Evaluation limit per task (quick runs only)."""
    eval_windows: int | None = None
    """Perplexity windows per task at most, apart from ``eval_limit`` (None: ``eval_limit``)."""
    eval_seq_len: int = 2048
    """Perplexity window length of the evaluation (capped at the model's context)."""
    out: Path = Path("study")
    """Report directory (also holds the manifest ``cells.json``)."""
    checkpoints: Path | None = None
    """Parent directory of the pruned checkpoints; None = ``DEPTHPRUNE_HOME/variants``."""
    registry_url: str | None = None
    """Registry URL; None = the default."""
    dtype: str = "float32"
    """dtype of calibration scoring and evaluation."""
    device: str = "cpu"
    """torch device of the calibration evaluator (with ``gpus`` above 1: the first card)."""
    gpus: int = 1
    """Cards one cell spreads its model over (device_map; vLLM tensor parallel); the memory plan sets it."""
    progress: bool = True
    """Show progress bars."""
    timing: str = "standalone"
    """Search-cost accounting: ``standalone`` (each search on a cold evaluator, the study's Table 4) or
    ``shared`` (one evaluator per group of cells, marginal costs); see :mod:`pruning.pipeline.prune`."""
    protect: tuple[str, ...] = ()
    """Blocks no search may remove (``first``, ``last``, indices); empty = none, the study's setting."""
    worker: bool = False
    """Work as one of several workers sharing the registry's queue of cells (:mod:`pruning.study.worker`)."""
    lease_seconds: float = 120.0
    """Worker mode: how long a claimed cell stays this worker's without a heartbeat (a killed worker's cell is
    taken over after this long)."""
    workers_per_gpu: int = 1
    """Worker mode on CUDA: workers sharing one card; each plans its cells' memory for its 1/N share."""
    keep_weights: str = "all"
    """``all``: every variant's checkpoint keeps its weights. ``none``: a variant's weight files are deleted
    once its evaluation is recorded (its directory keeps pruning.json, config, tokenizer and a note with the
    command that writes them again), for grids whose checkpoints would not fit on disk."""
    heal: str | None = None
    """``METHOD:STEPS`` (``lora:200``, ``distill:200``): heal every distinct mask and report before vs after
    healing (:mod:`pruning.study.healing`); None = no healing."""
    heal_data: str | None = None
    """Text spec to heal on; None = the study's text calibration data (see :mod:`pruning.study.healing`)."""

    def __post_init__(self):
        from pruning.calibration.objectives import get_objective
        from pruning.search import SEARCHES, STUDY_SEARCHES

        self.drops = tuple(sorted(set(self.drops)))
        if not self.drops or any(isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in self.drops):
            raise UserError(f"--drop needs positive integers, e.g. 4,6; got {self.drops}")
        if not self.objectives:
            raise UserError("--objectives needs at least one objective")
        for objective in self.objectives:
            get_objective(objective)
        self.searches = tuple(self.searches) or STUDY_SEARCHES
        for search in self.searches:
            if search not in SEARCHES:
                raise UserError(f"unknown search {search!r}; choose from {', '.join(SEARCHES)} or all")
        if len(self.searches) < 2:
            raise UserError("a study compares searches: give at least two (or 'all')")
        self.seeds = tuple(dict.fromkeys(self.seeds))
        if not self.seeds or any(not isinstance(s, int) or s < 0 for s in self.seeds):
            raise UserError(f"--seeds needs non-negative integers, got {self.seeds}")
        if self.data_seed is not None and (
            isinstance(self.data_seed, bool) or not isinstance(self.data_seed, int) or self.data_seed < 0
        ):
            raise UserError(f"--data-seed needs a non-negative integer, got {self.data_seed!r}")
        if self.samples < 1:
            raise UserError(f"--samples must be positive, got {self.samples}")
        from pruning.pipeline.prune import TIMINGS

        if self.timing not in TIMINGS:
            raise UserError(f"--timing must be one of {', '.join(TIMINGS)}, got {self.timing!r}")
        self.protect = tuple(str(item).strip() for item in self.protect if str(item).strip())
        if not self.lease_seconds > 0:
            raise UserError(f"--lease-seconds must be positive, got {self.lease_seconds}")
        check_workers_per_gpu(self)
        if self.keep_weights not in KEEP_WEIGHTS:
            raise UserError(f"--keep-weights must be {' or '.join(KEEP_WEIGHTS)}, got {self.keep_weights!r}")
        check_heal_options(self)
        from pruning.calibration.data.items import SAMPLINGS

        if self.sampling not in SAMPLINGS:
            raise UserError(f"unknown --sampling {self.sampling!r}; use one of {', '.join(SAMPLINGS)}")
        self.out = Path(self.out).expanduser()


def check_workers_per_gpu(config: StudyConfig) -> None:
    """``--workers-per-gpu N``: N worker processes share a card, so each plans for 1/N of it. Only workers
    share cards, and only evaluation on the torch engine plans per process (a vLLM engine takes a share of
    the whole card of its own)."""
    count = config.workers_per_gpu
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise UserError(f"--workers-per-gpu must be a positive integer, got {count!r}")
    if count > 1 and not config.worker:
        raise UserError("--workers-per-gpu is for --worker processes sharing a card: add --worker")
    if count > 1 and config.engine != "torch":
        raise UserError(
            f"--workers-per-gpu {count} needs --engine torch: a vLLM engine reserves a share of the whole "
            "card, not of one worker's part of it"
        )


@dataclass(frozen=True)
class Cell:
    """One point of the grid."""

    calibration: Any
    """The :class:`pruning.calibration.config.CalibrationConfig`."""
    drop: int
    """M."""
    search: str
    """Search name."""
    seed: int
    """Search seed."""
    prior: str = "single_block"
    """``single_block`` (the study's prior) or ``random`` (the control)."""
    timing: str = "shared"
    """The study's search-cost accounting; a result of another accounting is not reused (not in the key)."""
    protected: tuple[int, ...] = ()
    """Blocks protected from removal; a result under other protection is not reused (not in the key)."""
    reused_from: str | None = None
    """Key of the cell whose result this one copies instead of running (a deterministic search under a
    pinned calibration draw, seeds after the first); None = the cell runs."""

    @property
    def data_seed(self) -> int:
        """Seed of the calibration draw."""
        return self.calibration.seed

    @property
    def key(self) -> str:
        """Stable identity of the cell (the manifest key)."""
        cal = self.calibration
        clipped = f"@clip{cal.margin_clip:g}" if getattr(cal, "margin_clip", None) else ""
        return (
            f"{cal.objective}{clipped}|{cal.data}|{cal.samples}|{cal.seq_len}|{cal.seed}|{cal.sampling}|m{self.drop}|"
            f"{self.search}|seed{self.seed}|{self.prior}"
        )


@dataclass
class StudyPlan:
    """The checked grid."""

    config: StudyConfig
    model: str
    num_blocks: int
    demo_dir: Path | None
    cells: list[Cell]


def _default_seq_len(model_config) -> int:
    return min(2048, int(getattr(model_config, "max_position_embeddings", 2048)))


def _calibrations(config: StudyConfig, data: list[str], seq_len: int) -> list:
    """The calibration configurations: each objective on the first ``data`` spec of its kind (on every one
    with ``cross_controls``).

    Raises:
        UserError: an objective has no data of its kind.
    """
    from pruning.calibration.config import CalibrationConfig
    from pruning.calibration.data.specs import parse_spec
    from pruning.calibration.objectives import get_objective

    kinds = {spec: parse_spec(spec).kind for spec in data}
    calibrations = []
    for objective in config.objectives:
        kind = get_objective(objective).data_kind
        matching = [spec for spec in data if kinds[spec] == kind]
        if not matching:
            raise UserError(
                f"objective {objective!r} needs {kind.replace('_', '-')} data; none in --data "
                f"{','.join(data)}"
            )
        length = instance_length(kind, seq_len, config.choice_seq_len)
        for spec in matching if config.cross_controls else matching[:1]:
            calibrations.append(
                CalibrationConfig(
                    objective=objective,
                    data=spec,
                    samples=config.samples,
                    seq_len=length,
                    seed=0,  # the draw's seed is set per cell (data_seed_of)
                    sampling=config.sampling,
                    truncate=config.truncate,
                    margin_clip=config.margin_clip if _clips(objective) else None,
                )
            )
    return calibrations


def instance_length(kind: str, seq_len: int, choice_seq_len: int | None) -> int:
    """The calibration sequence length of data of ``kind``: ``--choice-seq-len`` for questions when given,
    else ``--seq-len``."""
    from ground.core.objectives import MULTIPLE_CHOICE

    return choice_seq_len if kind == MULTIPLE_CHOICE and choice_seq_len else seq_len


def _clips(objective: str) -> bool:
    """Whether ``objective`` takes ``--margin-clip``."""
    from ground.core.objectives import get_objective

    return "margin_clip" in get_objective(objective).parameters


def data_seed_of(config: StudyConfig, seed: int) -> int:
    """The calibration draw of ``seed``'s cells: ``--data-seed`` when pinned, else the seed itself (so seed 0
    draws what a study of one seed always drew)."""
    return config.data_seed if config.data_seed is not None else seed


def _reused(config: StudyConfig, cell: Cell) -> Cell:
    """``cell``, copying the first seed's cell when that gives its result: the draw is pinned, the seed is
    not the first, and the search's result does not depend on the seed (a random prior is seeded)."""
    from pruning.search import uses_seed

    first_seed = config.seeds[0]
    if config.data_seed is None or cell.seed == first_seed:
        return cell
    if uses_seed(cell.search, config.options.get(cell.search), random_prior=cell.prior == "random"):
        return cell
    return dataclasses.replace(cell, reused_from=dataclasses.replace(cell, seed=first_seed).key)


def plan_study(config: StudyConfig) -> StudyPlan:
    """Expand and check the grid without loading weights.

    Raises:
        UserError: an impossible budget, data of the wrong kind, an unknown search option.
    """
    from ground.demo.paths import find_demo_dir
    from pruning.model.blocks import load_config
    from pruning.pipeline.prune import canonical_model, plan_prune
    from pruning.search import PRIOR_GUIDED
    from pruning.search.base import resolve_protected

    model = canonical_model(config.model)
    model_config = load_config(model)
    num_blocks = int(model_config.num_hidden_layers)
    too_big = [m for m in config.drops if m >= num_blocks]
    if too_big:
        raise UserError(
            f"cannot remove {too_big[0]} of {num_blocks} blocks: choose 1 <= --drop < {num_blocks}"
        )
    demo_dir = find_demo_dir(model)
    data = list(config.data)
    if not data:
        data = (
            [f"demo:text@{demo_dir}", f"demo:qa@{demo_dir}"]
            if demo_dir is not None
            else [DEFAULT_DATA["text"], DEFAULT_DATA["multiple_choice"]]
        )
    calibrations = _calibrations(config, data, config.seq_len or _default_seq_len(model_config))
    priors = ["single_block"] + (["random"] if config.random_prior_control else [])
    if config.random_prior_control and not PRIOR_GUIDED & set(config.searches):
        raise UserError(
            f"--random-prior-control needs a prior-guided search ({', '.join(sorted(PRIOR_GUIDED))})"
        )
    protected = tuple(sorted(resolve_protected(config.protect, num_blocks)))
    cells = []
    for template in calibrations:
        for drop in config.drops:
            for seed in config.seeds:
                calibration = dataclasses.replace(template, seed=data_seed_of(config, seed))
                for prior in priors:
                    searches = [s for s in config.searches if prior == "single_block" or s in PRIOR_GUIDED]
                    group = [
                        Cell(calibration, drop, search, seed, prior, config.timing, protected)
                        for search in searches
                    ]
                    group = [_reused(config, cell) for cell in group]
                    running = tuple(cell.search for cell in group if cell.reused_from is None)
                    if running:  # prune's own checks (options, budgets, exhaustive limits), nothing heavy
                        plan_prune(cell_prune_config(config, model, group[0], running, progress=False))
                    cells += group
    return StudyPlan(config, model, num_blocks, demo_dir, cells)


def cell_options(config: StudyConfig, num_blocks: int, cell: Cell) -> dict[str, Any]:
    """The settings ``cell``'s search runs with: the study's ``--option``s for it, a budget in subset
    evaluations (``evaluations``) turned into the search's own
    (:func:`pruning.search.budgets.resolve_options`)."""
    from pruning.search.budgets import resolve_options

    return resolve_options(cell.search, config.options.get(cell.search, {}), num_blocks, cell.drop)


def cell_prune_config(config: StudyConfig, model: str, cell: Cell, searches: tuple[str, ...], progress: bool):
    """The PruneConfig of one group of cells (same calibration, drop, seed and prior; these ``searches``)."""
    from pruning.pipeline.config import prune_config_from

    return prune_config_from(
        model=model,
        calibration=cell.calibration,
        drop=cell.drop,
        searches=searches,
        seed=cell.seed,
        random_prior=cell.prior == "random",
        options={s: config.options.get(s, {}) for s in searches},
        out=config.checkpoints,
        registry_url=config.registry_url,
        dtype=config.dtype,
        device=config.device,
        gpus=config.gpus,
        progress=progress,
        timing=config.timing,
        protect=config.protect,
    )


# --------------------------------------------------------------------------------------------- manifest


def plan_summary(plan: StudyPlan) -> dict:
    """What the report says about the setup."""
    config = plan.config
    fields = ("objective", "data", "samples", "seq_len", "sampling")
    calibrations = sorted({tuple(getattr(c.calibration, name) for name in fields) for c in plan.cells})
    clips = {
        c.calibration.objective: c.calibration.margin_clip for c in plan.cells if c.calibration.margin_clip
    }
    from pruning.study.paths import recorded_path

    return {
        "model": recorded_path(plan.model),  # relative to the home when inside it: no machine path
        "model_name": Path(str(config.model)).name,  # as the user named it: smollm2-135m, Llama-3.1-8B
        "num_blocks": plan.num_blocks,
        "drops": list(config.drops),
        "objectives": list(config.objectives),
        "searches": list(config.searches),
        "seeds": list(config.seeds),
        "data_seed": config.data_seed,
        "random_prior_control": config.random_prior_control,
        "cross_controls": config.cross_controls,
        "timing": config.timing,
        "protect": list(config.protect),
        "calibrations": [
            {**dict(zip(fields, c, strict=True)), **({"margin_clip": clips[c[0]]} if c[0] in clips else {})}
            for c in calibrations
        ],
        "suites": list(config.suites),
        "engine": config.engine,
        "eval_limit": config.eval_limit,
        "eval_seq_len": config.eval_seq_len,
        **({"eval_windows": config.eval_windows} if config.eval_windows is not None else {}),
        "dtype": config.dtype,
        "options": config.options,
        "demo": plan.demo_dir is not None,
    }
