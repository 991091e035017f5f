"""``depthprune demo``: the whole job end to end, by default on a real pretrained LLM (SmolLM2-135M).

Resolves the model (the embedded ``smollm2-135m`` GGUF is converted once to a cached float32 checkpoint),
prints the plan (budget M, searches, calibration and evaluation sizes, load), prunes it under both
calibration objectives, registers every variant, repairs ``ppl-best`` without training (a real model:
:mod:`depthprune.cli.demo_repair`), evaluates each distinct one and the repaired child, serves dense and
the best variant of each objective through the gateway with one vLLM engine each, load-tests them side by
side, and prints its tables.
Every process it starts is stopped on the way out, Ctrl-C included.

Two plans (:func:`plan_demo`), sized so that ``make demo`` finishes in under 10 minutes on 2 cores:

* a real model (``smollm2-135m``, the default, or any ``--model PATH_OR_ID``): Python's documentation as
  data, offline — ``pydoc`` text for the perplexity objective, ``pydoc-phrase`` items (multi-word
  answers) for ``task_ce``, the ``offline`` evaluation suite on their test splits
  (:mod:`pruning.calibration.data.pydoc`), and one-pass searches, since a thorough search (``greedy``:
  ~27 min on SmolLM2) does not fit;
* ``--model demo``: the small Llama trained here on a generated corpus (cached), its own data and suite,
  with ``one_shot`` and ``greedy``.

Run: ``depthprune demo`` (``make demo``), ``depthprune demo --model demo``, or
``depthprune demo --recipe tiny --quick`` (the demo model's tiny recipe, a few minutes: what CI runs).
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated

from depthprune.cli import demo_repair
from depthprune.cli.demo_load import AA_TOLERANCE, load_test
from depthprune.cli.demo_table import aa_row, print_table, speed_columns
from depthprune.cli.demo_twins import served_speed_twins, speed_twin
from ground.core.cli_options import Override, cli, unset_if_none, with_options
from ground.core.errors import UserError
from ground.core.objectives import OBJECTIVES, TEXT
from ground.core.options import JsonOptions
from ground.core.processes import stop_process_group
from ground.core.settings import default_registry_url, home_dir

DEMO_MODEL = "demo"
"""``--model demo``: the small Llama the demo trains itself (cached), with its generated data."""
DEFAULT_MODEL = "smollm2-135m"
"""What ``depthprune demo`` prunes when no ``--model`` (or ``--recipe``) is given: the embedded real model."""
DEMO_RECIPES = ("default", "tiny")
TASK_OBJECTIVE = "task_ce"
"""The demo's task arm: the bounded answer cross-entropy (PuDDing's unbounded margin collapses the model:
docs/objectives.md)."""
BEST_ALIAS = {name: f"{OBJECTIVES[name].short_name}-best" for name in ("perplexity", TASK_OBJECTIVE)}
"""Objective -> the alias of its best variant (lowest validation loss among the searches that used it,
``registry.selection``); the demo serves these."""
EVALUATOR_BATCH_SIZE = 8
"""Sequences per forward of the pruning evaluator (``build_evaluator``'s default, which ``prune`` uses)."""


@dataclass(frozen=True)
class DemoSizes:
    """Calibration, evaluation and load-test sizes of one plan."""

    text_samples: int
    """Calibration text windows of the perplexity objective."""
    choice_samples: int
    """Calibration multiple-choice items of the task-margin objective."""
    seq_len: int
    """Calibration window length in tokens (and the longest an item may be)."""
    eval_seq_len: int
    """Held-out perplexity window length in tokens (capped at the model's context)."""
    eval_limit: int | None
    """At most this many held-out perplexity windows and multiple-choice items per model; None = all."""
    num_prompts: int
    """Load test: measured requests per model and round."""
    input_len: int
    """Load test: prompt tokens."""
    output_len: int
    """Load test: generated tokens per request (ignore_eos keeps it exact)."""
    rounds: int
    """Load test: fewest interleaved rounds (drift between models cancels)."""
    max_rounds: int = 12
    """Load test: most rounds; rounds are added until the stop rule is met or the budget is spent."""
    load_budget_s: float = 360.0
    """Load test: seconds after which no round is added (``loadtest --time-budget``)."""
    stop_rule: str = "decision"
    """Load test: ``decision`` (stop once each variant's interval excludes 1 and the A/A interval is within
    ±5 %: what the demo must show) or ``precision`` (every interval ±2 %: ``--precise``)."""
    patch_windows: int | None = None
    """Repair: calibration windows of ``heal --method patch`` (None: its default, 128)."""


PRECISE_MAX_ROUNDS = 36
"""``--precise``: most rounds of the ±2 % load test."""
PRECISE_BUDGET_S = 660.0
"""``--precise``: its time budget. Three runs from an empty home (benchmarks/demo_repeats.sh, 2026-11-26):
20, 32 and 32 rounds, A/A 1.00x within [0.98, 1.02] each time, 837-1,130 s for the whole demo."""


REAL_SIZES = DemoSizes(
    text_samples=8,
    choice_samples=24,
    seq_len=256,
    eval_seq_len=256,
    eval_limit=24,
    num_prompts=16,
    input_len=64,
    output_len=64,
    rounds=4,
    max_rounds=8,
    load_budget_s=150.0,
    patch_windows=64,
)
"""A real model (SmolLM2-135M), full run. Measured on 2026-11-26 (quiet machine, docs/benchmarks.md): a subset
evaluation costs ~6.8 s at 16 x 256 tokens, so the perplexity objective calibrates on 8 windows (one_shot's
31 evaluations in ~90 s, the same blocks as at 16); the patch reads 64 windows (half its default). The load
test runs dense, its A/A arm and ppl-best: ce-best keeps as many blocks of each kind, so its speed is
ppl-best's by construction (:mod:`.demo_twins`; ``--precise`` measures it too). Each engine decodes on one
core (vLLM reserves the other); 32 generated tokens instead of 64 saved only a sixth of a round (prefill on
one core dominates) and spread the rounds ±15 % instead of ±2.5 %. The three arms run one block of the
balanced order (6 rounds; ``max_rounds`` 8 rounds down to whole blocks), stopping there whether or not it
decided (ppl-best's interval excluding 1, the A/A one within ±5 %); the table shows the A/A interval either
way. A 25 % pruned model is ~1.3x faster (docs/benchmarks.md), far outside such intervals;
``--precise`` runs the ±2 % protocol instead."""
REAL_QUICK_SIZES = DemoSizes(4, 8, 128, 128, 4, 8, 64, 16, 2, max_rounds=2, load_budget_s=60)
"""A real model, ``--quick``."""
DEMO_SIZES = DemoSizes(32, 32, 128, 2048, None, 48, 128, 64, 2)
"""``--model demo``, full run (the demo model's own test data is small: every window and item)."""
DEMO_QUICK_SIZES = DemoSizes(8, 8, 64, 2048, None, 8, 128, 16, 2, max_rounds=2, load_budget_s=60)
"""``--model demo``, ``--quick`` (what the tests run, with ``--recipe tiny``)."""

REAL_SEARCHES = ("one_shot",)
"""A real model: SLEB's one-shot ranking (N + 1 subset evaluations), one search per objective so that the
objectives' choices compare like with like. ``--search one_shot,block_influence`` adds ShortGPT's block
influence (one pass over the dense model's hidden states, objective-free; about 1.5 minutes more with its
checkpoints and evaluation); ``greedy`` needs ~212 evaluations on SmolLM2 (~27 min)."""
DEMO_SEARCHES = ("one_shot", "greedy")
"""The demo model: a fast and a thorough search (SLEB's iterative elimination)."""
REAL_DATA = {"perplexity": "pydoc", TASK_OBJECTIVE: "pydoc-phrase"}
"""A real model's calibration data per objective: Python's documentation, offline."""
DEMO_DATA = {"perplexity": "demo:text", TASK_OBJECTIVE: "demo:qa"}
"""The demo model's calibration data per objective: its own held-out text and questions."""
REAL_SERVE_ARGS = ("--max-model-len", "512", "--vllm-arg=--enforce-eager")
"""``depthprune serve`` options for a real model: without torch.compile and with a short context (the
load test needs 160 tokens), a SmolLM2 engine starts in about 1 minute on 2 cores instead of 2.5, and
dense and variants run the same way, so their ratio holds."""
TINY_SERVE_ARGS = ("--vllm-arg=--enforce-eager",)
"""``depthprune serve`` options for the demo model's ``tiny`` recipe (8 blocks of width 64: a smoke run, what
the tests run): compiled or not, its engines' speed is per-step overhead, not its blocks (measured 2026-11-28
on 2 cores, ``--quick``: ppl-best / dense 0.89 compiled, 1.01 [0.24, 4.25] eager), and compiling three
engines held the run up: 431 s compiled, 251 s eager (engines ready at 6:29 and 3:27). The default recipe
serves vLLM's default, compiled."""


@dataclass(frozen=True)
class DemoPlan:
    """What one demo run does, decided before any pruning and printed at the start (:meth:`describe`)."""

    model: str
    """The model as given: ``smollm2-135m``, ``demo``, or a checkpoint directory, ``.gguf`` or hub id."""
    num_blocks: int
    """N, the dense model's blocks."""
    drop: int
    """M, the blocks every variant removes."""
    data: dict[str, str]
    """Objective -> calibration data spec (a demo model's ``demo:*`` specs get ``@DIR`` when used)."""
    searches: tuple[str, ...]
    """Searches run on each objective, in order, on one shared evaluator."""
    sizes: DemoSizes
    """Calibration, evaluation and load-test sizes."""
    serve_args: tuple[str, ...] = ()
    """More ``depthprune serve`` options (the same for dense and every variant)."""
    repair: bool = False
    """Patch ``ppl-best`` without training, show the child beside it (:mod:`depthprune.cli.demo_repair`)."""

    @property
    def is_demo_model(self) -> bool:
        """Whether the model is the self-trained demo model (its own data, suite and prompts)."""
        return self.model == DEMO_MODEL

    @property
    def suite(self) -> str:
        """The evaluation suite: ``demo`` for the demo model, ``offline`` (pydoc, pydoc-cloze) otherwise."""
        return "demo" if self.is_demo_model else "offline"

    @property
    def tasks(self) -> tuple[str, str]:
        """The suite's (perplexity task, accuracy task) as the registry records them."""
        return ("demo_text", "demo_qa") if self.is_demo_model else ("pydoc", "pydoc_cloze")

    @property
    def suite_contents(self) -> str:
        """What the evaluation suite measures, in words."""
        window = f"{self.sizes.eval_seq_len}-token windows"
        if self.is_demo_model:
            return f"{self.tasks[0]} perplexity, {window}; {self.tasks[1]} accuracy"
        return (
            f"in-domain pydoc perplexity and pydoc-cloze accuracy, out-of-domain GCIDE perplexity and "
            f"GCIDE-define accuracy; {window}"
        )

    @property
    def evaluation_limit(self) -> str:
        """How much of each task the evaluation reads, in words."""
        limit = self.sizes.eval_limit
        return "every window and item" if limit is None else f"at most {limit} of each"

    @property
    def ideal_speedup(self) -> float:
        """N / (N - M): the speed-up if time were proportional to the blocks run."""
        return self.num_blocks / (self.num_blocks - self.drop)

    def samples(self, objective: str) -> int:
        """Calibration samples of an objective: text windows, or multiple-choice items."""
        text = OBJECTIVES[objective].data_kind == TEXT
        return self.sizes.text_samples if text else self.sizes.choice_samples

    def calibration_data(self, objective: str, model_dir: str | Path) -> str:
        """The data spec ``prune`` gets: the demo model's data is named with its directory."""
        data = self.data[objective]
        return f"{data}@{model_dir}" if data.startswith("demo:") else data

    def describe(self) -> str:
        """The plan in a few lines (what ``depthprune demo`` prints before it starts pruning)."""
        sizes = self.sizes
        lines = [
            f"plan: {self.model} ({self.num_blocks} blocks): remove M = {self.drop} "
            f"({self.drop / self.num_blocks:.0%}; ideal speed-up N/(N-M) = {self.ideal_speedup:.2f}x)",
            f"  perplexity  on {self.data['perplexity']}: {sizes.text_samples} windows x "
            f"{sizes.seq_len} tokens, batch {EVALUATOR_BATCH_SIZE}",
            f"  {TASK_OBJECTIVE}     on {self.data[TASK_OBJECTIVE]}: {sizes.choice_samples} items of at most "
            f"{sizes.seq_len} tokens, batch {EVALUATOR_BATCH_SIZE} sequences",
            f"  searches on each objective: {', '.join(self.searches)}",
            f"  evaluation: {self.suite} suite ({self.suite_contents}), {self.evaluation_limit}",
            *([demo_repair.describe(self)] if self.repair else []),
            f"  serving: dense, {', '.join(BEST_ALIAS.values())} through the gateway, one vLLM engine each"
            + (f" ({' '.join(self.serve_args)})" if self.serve_args else ""),
            f"  load test: {sizes.rounds}-{max(sizes.rounds, sizes.max_rounds)} interleaved rounds "
            f"(at most {sizes.load_budget_s:g} s) x {sizes.num_prompts} requests x "
            f"({sizes.input_len} prompt + {sizes.output_len} generated tokens) per model and an A/A control, "
            "all at once, "
            + (
                "until every interval is ±2 %"
                if sizes.stop_rule == "precision"
                else f"until each variant's interval excludes 1 and the A/A one is within ±{AA_TOLERANCE:.0%}"
            ),
        ]
        return "\n".join(lines)


def search_list(text: str | None) -> tuple[str, ...] | None:
    """``demo --search``: the comma-separated searches, or None (the plan's)."""
    return None if text is None else tuple(part.strip() for part in text.split(",") if part.strip())


@dataclass
class DemoConfig:
    """What the demo runs; the defaults finish in under 10 minutes on 2 cores (the model cached)."""

    model: str | None = field(
        default=None,
        metadata=cli(
            help="smollm2-135m (the embedded real model), demo (the model trained here), or a checkpoint "
            "directory, .gguf file or hub id (default: demo with --recipe, else smollm2-135m)."
        ),
    )
    """``smollm2-135m``, ``demo``, or a checkpoint directory, ``.gguf`` file or hub id; None = ``demo`` when a
    ``recipe`` is given, else ``smollm2-135m``."""
    recipe: str | None = field(
        default=None,
        metadata=cli(help="Demo model recipe: default (16 blocks) or tiny (seconds); implies --model demo."),
    )
    """Demo model recipe (``--model demo`` only): ``default`` (16 blocks, trained once) or ``tiny``."""
    quick: bool = field(
        default=False,
        metadata=cli(help="Smaller calibration, evaluation and load (a smoke run, e.g. in CI)."),
    )
    """Smaller calibration, evaluation and load (a smoke run)."""
    precise: bool = field(
        default=False,
        metadata=cli(
            help="Load test until every interval is ±2 % (up to 660 s) instead of until each variant's "
            "interval excludes 1 and the A/A one is within ±5 % (about 18 minutes in all instead of 10)."
        ),
    )
    """Load test until every interval is ±2 % (up to 36 rounds, 660 s) instead of until decided."""
    drop_fraction: float = field(
        default=0.25, metadata=cli(help="Fraction of the blocks to remove (M = round(N x it)).")
    )
    """Fraction of blocks to remove (rounded to the nearest whole block, at least one)."""
    searches: tuple[str, ...] | None = field(
        default=None,
        metadata=cli(
            name="search",
            type=str | None,
            parse=search_list,
            help="Comma-separated searches per objective (default: one_shot; --model demo: one_shot,greedy).",
        ),
    )
    """Searches per objective; None = the plan's (:data:`REAL_SEARCHES` or :data:`DEMO_SEARCHES`)."""
    samples: int | None = field(
        default=None, metadata=cli(help="Calibration samples per objective (default: the plan's).")
    )
    """Calibration samples per objective; None = the plan's."""
    seq_len: int | None = field(
        default=None, metadata=cli(help="Calibration tokens per sample (default: the plan's).")
    )
    """Calibration sequence length in tokens; None = the plan's."""
    eval_limit: int | None = field(
        default=None,
        metadata=cli(help="Held-out windows and items per model and task (default: the plan's)."),
    )
    """Held-out windows and items per model and task; None = the plan's."""
    num_prompts: int | None = None
    """Load test: measured requests per model and round; None = the plan's."""
    output_len: int | None = None
    """Load test: generated tokens per request; None = the plan's."""
    rounds: int | None = None
    """Load test: interleaved rounds; None = the plan's."""
    port: int = field(default=8765, metadata=cli(help="Gateway port on 127.0.0.1."))
    """Gateway port (loopback only)."""
    out: Path = field(
        default_factory=lambda: home_dir() / "demo",
        metadata=cli(
            type=Path | None,
            default=None,
            parse=unset_if_none,
            help="Report directory (default: DEPTHPRUNE_HOME/demo).",
        ),
    )
    """Where the load-test report, its plots and the summary go."""
    registry_url: str | None = field(
        default=None,
        metadata=cli(name="registry", help="Registry URL (default: SQLite in DEPTHPRUNE_HOME)."),
    )
    """Registry URL; None = the default."""
    started: float = field(default_factory=time.monotonic, compare=False)
    """``time.monotonic()`` when the demo began (each step heading shows the minutes since)."""

    def __post_init__(self):
        if self.recipe is not None and self.recipe not in DEMO_RECIPES:
            raise UserError(f"unknown recipe {self.recipe!r}; use default or tiny")
        if self.model is None:
            self.model = DEMO_MODEL if self.recipe is not None else DEFAULT_MODEL
        if self.model == DEMO_MODEL:
            self.recipe = self.recipe or "default"
        elif self.recipe is not None:
            raise UserError(
                f"--recipe chooses the demo model's recipe: use it with --model demo, not {self.model}"
            )
        if not 0 < self.drop_fraction < 1:
            raise UserError(f"--drop-fraction must be between 0 and 1, got {self.drop_fraction}")
        for name, value in (
            ("--samples", self.samples),
            ("--seq-len", self.seq_len),
            ("--eval-limit", self.eval_limit),
            ("--num-prompts", self.num_prompts),
            ("--output-len", self.output_len),
            ("--rounds", self.rounds),
        ):
            if value is not None and value < 1:
                raise UserError(f"{name} must be at least 1, got {value}")
        if self.searches is not None:
            self.searches = tuple(self.searches)
            check_searches(self.searches)
        if not 1024 <= self.port <= 65535:
            raise UserError(f"--port must be in 1024..65535, got {self.port}")


def check_searches(searches: tuple[str, ...]) -> None:
    """A one-line :class:`UserError` unless every name is a search of ``pruning.search.SEARCHES``."""
    from pruning.search import SEARCHES

    if not searches:
        raise UserError("--search: name at least one search")
    unknown = [name for name in searches if name not in SEARCHES]
    if unknown:
        raise UserError(f"unknown search {unknown[0]!r}; choose from {', '.join(SEARCHES)}")


def plan_demo(config: DemoConfig, num_blocks: int) -> DemoPlan:
    """The plan of a demo run on a model of ``num_blocks`` blocks: the model's defaults, then the overrides.

    Args:
        config: the run's settings (model, quick, overrides).
        num_blocks: N of the dense model (from its config).

    Returns:
        The :class:`DemoPlan`, with M = ``round(N * drop_fraction)`` (at least 1, at most N - 1).
    """
    demo = config.model == DEMO_MODEL
    if demo:
        sizes = DEMO_QUICK_SIZES if config.quick else DEMO_SIZES
    else:
        sizes = REAL_QUICK_SIZES if config.quick else REAL_SIZES
    overrides = {
        "text_samples": config.samples,
        "choice_samples": config.samples,
        "seq_len": config.seq_len,
        "eval_limit": config.eval_limit,
        "num_prompts": config.num_prompts,
        "output_len": config.output_len,
        "rounds": config.rounds,
    }
    sizes = replace(sizes, **{key: value for key, value in overrides.items() if value is not None})
    if config.precise:
        precise = dict(stop_rule="precision", max_rounds=PRECISE_MAX_ROUNDS, load_budget_s=PRECISE_BUDGET_S)
        sizes = replace(sizes, **precise)
    if num_blocks < 2:
        raise UserError(f"{config.model} has {num_blocks} block(s): depth pruning needs at least 2")
    drop = min(num_blocks - 1, max(1, round(num_blocks * config.drop_fraction)))
    return DemoPlan(
        model=config.model,
        num_blocks=num_blocks,
        drop=drop,
        data=dict(DEMO_DATA if demo else REAL_DATA),
        searches=config.searches or (DEMO_SEARCHES if demo else REAL_SEARCHES),
        sizes=sizes,
        serve_args=(TINY_SERVE_ARGS if config.recipe == "tiny" else ()) if demo else REAL_SERVE_ARGS,
        repair=not demo,
    )


def say(config: DemoConfig, message: str) -> None:
    """A step heading with the minutes since the demo started, on stderr so ``--json`` output stays clean."""
    minutes, seconds = divmod(int(time.monotonic() - config.started), 60)
    print(f"\n== [{minutes}:{seconds:02d}] {message}", file=sys.stderr, flush=True)


def build_model(config: DemoConfig) -> Path:
    """The demo model's directory, trained on first use (``--model demo``)."""
    from ground.demo.model import ensure_demo_model, read_quality
    from ground.demo.recipe import DemoRecipe

    recipe = DemoRecipe.tiny() if config.recipe == "tiny" else DemoRecipe()
    say(config, f"demo model ({config.recipe} recipe; built once, then reused from the cache)")
    directory = ensure_demo_model(recipe, progress=True)
    quality = read_quality(directory)
    print(f"   {directory}\n   {json.dumps(quality)[:300]}", file=sys.stderr)
    return directory


def prepare_model(config: DemoConfig) -> Path | str:
    """The checkpoint every step loads: the demo model, a GGUF's cached conversion, or the model as given."""
    if config.model == DEMO_MODEL:
        return build_model(config)
    from pruning.model.sources import resolve_model

    say(config, f"model {config.model} (a GGUF is converted once to float32, then reused from the cache)")
    resolved = resolve_model(config.model)
    source = resolved.source
    described = f" (from {source.path}, sha256 {source.sha256[:16]})" if source is not None else ""
    print(f"   {resolved.model}{described}", file=sys.stderr)
    return resolved.model


def read_num_blocks(model_dir: Path | str) -> int:
    """N, the number of transformer blocks, from the model's config (no weights loaded)."""
    from pruning.model.blocks import load_config

    return int(load_config(str(model_dir)).num_hidden_layers)


def prune_variants(config: DemoConfig, plan: DemoPlan, model_dir: Path | str, registry) -> dict[str, list]:
    """``objective -> [VariantOutcome per search]``; aliases the best of each objective."""
    from pruning.calibration.config import CalibrationConfig
    from pruning.pipeline.config import prune_config_from
    from pruning.pipeline.prune import canonical_model, prune
    from registry.selection import best_for_objective

    outcomes = {}
    for objective, data in plan.data.items():
        say(
            config,
            f"prune {plan.drop} of {plan.num_blocks} blocks: {objective} on {data} "
            f"({', then '.join(plan.searches)})",
        )
        calibration = CalibrationConfig(
            objective=objective,
            data=plan.calibration_data(objective, model_dir),
            samples=plan.samples(objective),
            seq_len=plan.sizes.seq_len,
            seed=0,
        )
        outcomes[objective] = prune(
            prune_config_from(
                model=str(model_dir),
                calibration=calibration,
                drop=plan.drop,
                searches=plan.searches,
                registry_url=config.registry_url,
            )
        )
        for outcome in outcomes[objective]:
            print(
                f"   {outcome.search}: removed {outcome.removed_blocks}, calibration loss "
                f"{outcome.calibration_loss:.3f} (dense {outcome.dense_loss:.3f}), validation loss "
                f"{outcome.validation_loss:.3f}, fit {outcome.fit}, "
                f"{outcome.subset_evaluations} subset evaluations in {outcome.search_seconds:.0f} s",
                file=sys.stderr,
            )
    chosen = {}
    for objective in outcomes:
        # searched variants only: the demo serves these, and a repaired child's speed is its parent's
        best = best_for_objective(registry, objective, canonical_model(str(model_dir)), repaired=False)
        registry.set_alias(BEST_ALIAS[objective], best.name)
        chosen[objective] = best.removed_blocks
        print(f"   {BEST_ALIAS[objective]} -> {best.name} (removed {best.removed_blocks})", file=sys.stderr)
    if len({tuple(blocks) for blocks in chosen.values()}) == 1:
        say(
            config,
            f"both objectives chose the same blocks {next(iter(chosen.values()))}: the A/B arms are "
            "the same model",
        )
    return outcomes


def served_names(registry, base_model: str) -> dict[str, str]:
    """``dense`` and each best alias -> the name the gateway serves it under.

    The alias itself while the registry holds one base model. With several (the demo model and SmolLM2 in
    one home, say) ``dense`` and ``ppl-best`` are ambiguous, and a served name cannot carry ``@BASE``
    (``loadtest --models`` reads ``NAME@URL``), so the demo adds aliases qualified by the base model's short
    name (``ppl-best-smollm2-135m``) and serves those.
    """
    from registry.naming import model_slug

    roles = ["dense", *BEST_ALIAS.values()]
    if len(registry.base_models()) <= 1:
        return {role: role for role in roles}
    names = {}
    for role in roles:
        names[role] = f"{role}-{model_slug(base_model)}"
        registry.set_alias(names[role], f"{role}@{base_model}")
    return names


def measured_as(outcomes: dict[str, list]) -> dict[str, str]:
    """Variant name -> the variant whose evaluation it shows: the first with the same removed blocks.

    Two searches (or two objectives) often pick the same blocks; the checkpoints are then the same model,
    so it is evaluated once.
    """
    first_with: dict[tuple[int, ...], str] = {}
    chosen = {}
    for items in outcomes.values():
        for outcome in items:
            chosen[outcome.name] = first_with.setdefault(tuple(outcome.removed_blocks), outcome.name)
    return chosen


def evaluate(
    config: DemoConfig, plan: DemoPlan, dense: str, outcomes: dict[str, list], registry, extra=()
) -> None:
    """Evaluate dense, every distinct variant and ``extra`` (the repaired child) on the plan's suite with the
    torch engine (recorded)."""
    from pruning.evaluation.suites import EvalSettings, evaluate_variants

    twins = {name: measured for name, measured in measured_as(outcomes).items() if name != measured}
    names = [dense, *[name for name, measured in measured_as(outcomes).items() if name == measured], *extra]

    what = f"the {plan.suite} suite ({plan.suite_contents}; {plan.evaluation_limit})"
    say(config, f"evaluate {len(names)} models on {what}")
    for name, measured in twins.items():
        print(
            f"   {name} removes the same blocks as {measured}: the same model, evaluated once",
            file=sys.stderr,
        )
    settings = EvalSettings(
        suites=(plan.suite,), engine="torch", seq_len=plan.sizes.eval_seq_len, limit=plan.sizes.eval_limit
    )
    evaluate_variants(names, settings, registry)


@contextlib.contextmanager
def gateway(config: DemoConfig, plan: DemoPlan, served: list[str], log_path: Path):
    """Start ``depthprune serve`` in its own process group and stop it when the block exits; yields a function
    that waits until every engine is up and returns the gateway's URL.

    The engines start while the repair and the evaluation run: those measure quality, which sharing the cores
    does not change, and the load test, which it would, starts only once the wait has returned.
    """
    command = [sys.executable, "-m", "depthprune", "serve", "--variants", ",".join(served)]
    command += ["--port", str(config.port), "--json", *plan.serve_args]
    if config.registry_url:
        command += ["--registry", config.registry_url]
    say(
        config,
        f"serve {', '.join(served)} through the gateway (one vLLM engine each, started one after another "
        "in the background while the next steps run)",
    )
    log = log_path.open("w")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)

    def wait_for_url() -> str:
        started = time.monotonic()
        line = process.stdout.readline()  # serve prints one JSON line once every backend is up
        if not line:
            process.wait(timeout=30)
            tail = "".join(log_path.read_text().splitlines(keepends=True)[-15:])
            raise UserError(f"the gateway did not start (exit {process.returncode}); its log ends:\n{tail}")
        url = json.loads(line)["url"]
        waited = time.monotonic() - started
        print(f"   gateway at {url} (log: {log_path}; waited {waited:.0f} s for it)", file=sys.stderr)
        return url

    try:
        yield wait_for_url
    finally:
        # SIGINT, as Ctrl-C: serve stops its vLLM engines cleanly; SIGKILL for whatever is left after 30 s
        stop_process_group(process, signal.SIGINT, grace_s=30.0)
        log.close()


def summary_rows(
    outcomes: dict[str, list],
    registry,
    loadtest: dict,
    served: dict[str, str],
    plan: DemoPlan,
    repaired=None,
    twins: dict[str, str] | None = None,
) -> list[dict]:
    """One row per variant (dense first): what the final table and ``--json`` show.

    Args:
        outcomes: ``objective -> [VariantOutcome]`` of :func:`prune_variants`.
        registry: the open registry (evaluations are read from it).
        loadtest: the load test's saved result (its ``comparison`` against dense).
        served: ``dense`` and each best alias -> the served name (:func:`served_names`).
        plan: the run's plan (which tasks hold perplexity and accuracy).
        repaired: the repaired child (:class:`~depthprune.cli.demo_repair.Repaired`), or None: its row
            follows its parent's.
        twins: ``role -> role`` whose speed it has, not load-tested (:func:`served_speed_twins`).

    Returns:
        Rows with removed blocks, objective, search, calibration loss, held-out perplexity, accuracy
        (``qa_accuracy``: the demo QA task or the pydoc cloze task), ``quality`` (per task: dense's value
        and interval, a variant's paired retention and verdict) and the speed ratios to dense.
    """
    comparison = loadtest.get("comparison", {})
    role_of = {registry.resolve(name).name: role for role, name in served.items() if role != "dense"}
    measured = measured_as(outcomes)
    extra = [repaired.name] if repaired else []
    quality = quality_against_dense(registry, served["dense"], sorted(set(measured.values())) + extra)
    rows = [
        {
            "variant": "dense",
            "name": "dense",
            "removed_blocks": [],
            "objective": "-",
            "search": "-",
            "calibration_loss": None,
            "validation_loss": None,
            "fit": True,
            **evaluation_metrics(registry, served["dense"], plan),
            "quality": quality[served["dense"]],
            **speed_columns(None),
        }
    ]
    if loadtest.get("aa"):
        rows.append(aa_row(loadtest["aa"]))
    for objective, items in outcomes.items():
        for outcome in items:
            role = role_of.get(outcome.name)
            rows.append(
                {
                    "variant": role or f"#{outcome.id}",
                    "name": outcome.name,
                    "removed_blocks": outcome.removed_blocks,
                    "objective": objective,
                    "search": outcome.search,
                    "calibration_loss": outcome.calibration_loss,
                    "validation_loss": outcome.validation_loss,
                    "fit": outcome.fit,
                    **evaluation_metrics(registry, measured[outcome.name], plan),
                    "quality": quality[measured[outcome.name]],
                    **speed_columns(comparison.get(served[role]) if role else None),
                    **speed_twin(role, twins or {}),
                }
            )
    if repaired is None:
        return rows
    child = registry.resolve(repaired.name)
    metrics = evaluation_metrics(registry, repaired.name, plan)
    row = demo_repair.repaired_row(repaired, child, metrics, quality[child.name])
    return demo_repair.with_repaired(rows, row)


def quality_against_dense(registry, dense: str, names: list[str]) -> dict[str, dict]:
    """``name -> {task: record}``: dense's values with intervals and each variant's retention of them,
    paired over the same items (:func:`pruning.evaluation.paired.recorded_comparison`)."""
    from pruning.evaluation.paired import recorded_comparison

    compared = recorded_comparison(registry, [dense, *[name for name in names if name != dense]])
    return {entry["model"]: entry["tasks"] for entry in compared}


def evaluation_metrics(registry, name: str, plan: DemoPlan) -> dict:
    """The latest held-out perplexity and accuracy (``acc``) of a variant on the plan's tasks."""
    perplexity_task, accuracy_task = plan.tasks
    latest = {}
    for item in registry.evaluations(name):  # ordered by id within each task and metric
        latest[(item.task, item.metric)] = item.value
    return {
        "perplexity": latest.get((perplexity_task, "perplexity")),
        "qa_accuracy": latest.get((accuracy_task, "acc")),
    }


def run_demo(config: DemoConfig) -> list[dict]:
    """Run every step; returns the final table's rows."""
    from registry import open_registry

    config.out.mkdir(parents=True, exist_ok=True)
    registry = open_registry(config.registry_url or default_registry_url())
    model_dir = prepare_model(config)
    plan = plan_demo(config, read_num_blocks(model_dir))
    print(plan.describe(), file=sys.stderr, flush=True)
    outcomes = prune_variants(config, plan, model_dir, registry)
    base_model = registry.resolve(next(iter(outcomes.values()))[0].name).base_model
    served = served_names(registry, base_model)  # the repair adds a child; it moves no alias
    twins = {} if config.precise else served_speed_twins(registry, served, model_dir)
    with gateway(config, plan, list(served.values()), config.out / "serve.log") as wait_for_url:
        repaired = demo_repair.repair_best(config, plan, registry, base_model, say)
        evaluate(config, plan, served["dense"], outcomes, registry, [repaired.name] if repaired else [])
        url = wait_for_url()
        tested = [name for role, name in served.items() if role not in twins]
        loadtest = load_test(config, plan, url, tested, model_dir, say)
    rows = summary_rows(outcomes, registry, loadtest, served, plan, repaired, twins)
    (config.out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    print_table(rows, config.out, plan)
    return rows


@with_options
def demo(
    config: DemoConfig,
    output: Annotated[JsonOptions, Override(as_json="Print the final table as one JSON line.")],
) -> None:
    """Prune a real pretrained LLM (SmolLM2-135M) under both objectives, evaluate, serve with vLLM, load-test.

    Prints the plan first (M, searches, calibration and evaluation sizes, load), then one heading per step
    with the minutes so far, then one table. ``--model demo`` runs on the small model trained here instead.
    """
    rows = run_demo(config)
    print(f"demo finished in {time.monotonic() - config.started:.0f} s", file=sys.stderr)
    if output.as_json:
        print(json.dumps(rows))
