"""Command-line functions of the pruning side: ``checkpoint``, ``prune``, ``heal``, ``eval``
and ``study`` (``bench-evaluator``: :mod:`pruning.cli.bench`).

Each function's typed signature is its command line (typer). Options every command shares (registry, dtype,
device, seed, ``--json``) come from :mod:`depthprune.core.options`; options several commands of this module
share are the aliases below. Heavy modules (torch, transformers) are imported inside the functions so that
``depthprune --help`` stays fast.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from depthprune.core.fitness import DEFAULT_MAX_PPL_RATIO
from depthprune.core.objectives import objectives_help
from depthprune.core.options import (
    DeviceOption,
    DryRunOption,
    DtypeOption,
    GpuMemoryOption,
    GpusOption,
    JsonOption,
    RegistryOption,
    SeedOption,
)
from pruning.cli.groups import comma_list, suite_list

# Help texts list the searches from their source, so a new search shows up without editing them.
from pruning.cli.options import (
    EstimatorOption,
    KlWeightOption,
    LastBlocksOption,
    MarginClipOption,
    MaxPerplexityRatioOption,
    PatchSamplesOption,
    PruneHealDataOption,
    PruneHealOption,
    RidgeOption,
    TruncateOption,
    ValidationOption,
)
from pruning.search import SEARCHES, STUDY_SEARCHES

ModelOption = Annotated[
    str,
    typer.Option(
        help="The dense model: hub id, local directory, a .gguf file, or smollm2-135m (the embedded "
        "SmolLM2-135M-Instruct)."
    ),
]
"""The dense model a command starts from."""

PruneDataOption = Annotated[
    str,
    typer.Option(
        help="Calibration data: c4, wikitext2, lambada, commonsense170k[:PATH], demo:text, demo:qa, "
        "text:PATH or mc:PATH (its kind must suit the objective; 'depthprune data show' prints it)."
    ),
]
"""``prune --data``: one calibration data spec."""

SamplingOption = Annotated[
    str,
    typer.Option(
        help="Text instances: documents (one document each, truncated to --seq-len; shorter ones skipped, "
        "the study's way) or stream (windows cut from all documents joined)."
    ),
]
"""``prune --sampling``, ``study --sampling``, ``data show --sampling``."""

ObjectiveOption = Annotated[str, typer.Option(help=f"Calibration objective: {objectives_help()}.")]
"""One calibration objective (the help lists :data:`~depthprune.core.objectives.OBJECTIVES`)."""

CalibrationSamplesOption = Annotated[
    int, typer.Option(help="Calibration samples (text windows or questions).")
]
"""Calibration samples of one configuration."""

CheckpointsOption = Annotated[
    Path | None,
    typer.Option(help="Parent directory of the pruned checkpoints (default: DEPTHPRUNE_HOME/variants)."),
]
"""Where pruned checkpoints are written (``prune --out``, ``study --checkpoints``)."""

MemoryBudgetOption = Annotated[
    float | None,
    typer.Option(
        help="Memory the evaluator's cache of block-boundary hidden states may use "
        "(default: a share of what is free)."
    ),
]
"""Memory of the subset scorer's boundary cache."""

ProtectOption = Annotated[
    str | None,
    typer.Option(
        help="Blocks no search may remove, comma-separated: first, last or block indices (SLEB, PuDDing and "
        "LoRP keep first,last). Default: none."
    ),
]
"""``prune --protect``, ``study --protect``."""

TimingOption = Annotated[
    str,
    typer.Option(
        help="Search-cost accounting: standalone (each search alone on a cold memo, the study's Table 4; "
        "fast_block_select not charged the prior) or shared (one memoised evaluator for all searches: "
        "marginal costs)."
    ),
]
"""``prune --timing``, ``study --timing`` (their defaults differ: shared and standalone)."""

EvalSuiteOption = Annotated[
    str,
    typer.Option(
        help="perplexity (WikiText-2, C4, LAMBADA), zero-shot (HellaSwag, WinoGrande, ARC-E/C, PIQA, "
        "BoolQ), demo (the demo model's local text perplexity and QA accuracy), offline (real text and "
        "questions that need no network), all (demo suites on a demo model, else perplexity + zero-shot), "
        "or your own files: text:PATH (perplexity) and mc:PATH (accuracy), the formats prune --data takes; "
        "comma-separated for several."
    ),
]
"""Evaluation suites (``eval --suite``, ``study --suite``)."""

EvalLimitOption = Annotated[
    int | None,
    typer.Option(help="At most N perplexity windows / N documents per task (quick checks; recorded)."),
]
"""Evaluation limit per task (``eval --limit``, ``study --eval-limit``)."""

EvalWindowsOption = Annotated[
    int | None,
    typer.Option(
        help="At most N perplexity windows per task, apart from the item limit (default: the limit)."
    ),
]
"""Perplexity windows per task (``eval --windows``, ``study --eval-windows``)."""

EvalSeqLenOption = Annotated[
    int,
    typer.Option(help="Perplexity window length in tokens (non-overlapping; capped at the model's context)."),
]
"""Perplexity window of the evaluation (``eval --seq-len``, ``study --eval-seq-len``)."""


# ------------------------------------------------------------------------------------------- checkpoint


def checkpoint(
    model: ModelOption,
    remove: Annotated[str, typer.Option(help="Original indices of the blocks to remove, e.g. 3,7,8.")],
    out: Annotated[Path, typer.Option(help="Directory to write the pruned checkpoint to.")],
    revision: Annotated[str | None, typer.Option(help="Hub revision of the model.")] = None,
    dtype: Annotated[str | None, typer.Option(help="Save in this dtype (default: the model's own).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print pruning.json as one JSON line.")] = False,
) -> None:
    """Write a variant of MODEL without the given blocks as an ordinary Hugging Face checkpoint."""
    from dataclasses import asdict

    from pruning.model.blocks import parse_block_list
    from pruning.model.checkpoint import write_pruned_checkpoint

    written = write_pruned_checkpoint(
        model, parse_block_list(remove), out, revision=revision, dtype=dtype, overwrite=overwrite
    )
    if as_json:
        print(json.dumps(asdict(written)))
    else:
        print(
            f"wrote {written.path}: removed blocks {written.removed_blocks} of {written.base_num_blocks} "
            f"({written.architecture}), weights sha256 {written.weights_sha256[:12]}"
        )


# ------------------------------------------------------------------------------------------------- eval


def _print_evaluation_tables(outcome) -> None:
    """Per model, each task's ``n`` and value with its 95 % interval; after the first model, the paired change
    against it, retention and verdict (:mod:`pruning.evaluation.report`)."""
    from pruning.evaluation.report import quality_lines
    from pruning.evaluation.suites import results_as_json

    print("\n".join(quality_lines(results_as_json(outcome))))


def evaluate(
    variants: Annotated[
        list[str],
        typer.Argument(
            help="Variants to evaluate: registry names, aliases, 'dense' (or dense@BASE), "
            "or checkpoint directories."
        ),
    ],
    suite: EvalSuiteOption = "all",
    registry: RegistryOption = None,
    engine: Annotated[
        str,
        typer.Option(
            help="auto (vLLM when installed, else transformers), vllm, or hf (plain torch forward)."
        ),
    ] = "auto",
    limit: EvalLimitOption = None,
    windows: EvalWindowsOption = None,
    seq_len: EvalSeqLenOption = 2048,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
    num_fewshot: Annotated[int, typer.Option(help="Few-shot examples for lm-eval tasks (the study: 0).")] = 0,
    no_record: Annotated[
        bool, typer.Option("--no-record", help="Do not store the results in the registry.")
    ] = False,
    as_json: JsonOption = False,
    dry_run: DryRunOption = False,
    gpus: GpusOption = None,
    gpu_memory_gib: GpuMemoryOption = None,
) -> None:
    """Measure perplexity and accuracy of dense and pruned variants, each with n and a 95 % interval, every
    variant paired against the first named on the same items; record them in the registry."""
    from depthprune.planning.devices import auto_device_dtype
    from pruning.evaluation.suites import EvalSettings, evaluate_variants, results_as_json
    from pruning.runtime.plans import PlanRequest
    from registry import open_registry

    device, dtype = auto_device_dtype(device, dtype, gpus, gpu_memory_gib)
    settings = EvalSettings(
        suites=suite_list(suite),
        engine=engine,
        dtype=dtype,
        device=device,
        seq_len=seq_len,
        limit=limit,
        windows=windows,
        num_fewshot=num_fewshot,
        progress=not as_json,
    )
    plan = PlanRequest(dry_run, gpus, gpu_memory_gib, as_json)
    outcome = evaluate_variants(variants, settings, open_registry(registry), record=not no_record, plan=plan)
    if as_json:
        print(json.dumps(results_as_json(outcome), indent=2))
    else:
        _print_evaluation_tables(outcome)


# ------------------------------------------------------------------------------------------------ prune


PruneSearchOptions = Annotated[
    list[str] | None,
    typer.Option(
        "--option",
        "-o",
        help="Search option KEY=VALUE (every selected search that has it) or "
        "SEARCH.KEY=VALUE, e.g. -o beam.width=3 -o bayesian.trials=50 "
        "-o bayesian.storage=postgresql+psycopg://host/db. Repeatable.",
    ),
]
"""``prune --option``/``-o``: search settings, repeatable."""


def _print_variant(outcome, as_json: bool) -> None:
    """One line per variant the prune run wrote: JSON, or the mask, losses and cost in words."""
    from dataclasses import asdict

    if as_json:
        print(json.dumps(asdict(outcome)), flush=True)
    else:
        print(
            f"{outcome.search}: removed {outcome.removed_blocks}, calibration loss "
            f"{outcome.calibration_loss:.4f} (dense {outcome.dense_loss:.4f}), "
            f"{outcome.search_seconds:.1f} s, {outcome.subset_evaluations} subsets, "
            f"{outcome.block_forwards} block-forwards; validation loss {outcome.validation_loss:.4f}, "
            f"fit {outcome.fit}{', selected' if outcome.selected else ''} -> {outcome.name} "
            f"({outcome.checkpoint})",
            flush=True,
        )


def prune(
    model: ModelOption,
    objective: ObjectiveOption,
    data: PruneDataOption,
    drop: Annotated[int, typer.Option(help="M, the number of blocks to remove.")],
    search: Annotated[
        str,
        typer.Option(
            help=f"Search algorithm: {', '.join(SEARCHES)}; comma-separated for several, or 'all' (every one "
            "but exhaustive) on one shared evaluator."
        ),
    ] = "greedy",
    seed: Annotated[int, typer.Option(help="Seed of the search(es).")] = 0,
    samples: CalibrationSamplesOption = 64,
    seq_len: Annotated[int, typer.Option(help="Tokens per calibration window.")] = 2048,
    data_seed: Annotated[int, typer.Option(help="Seed of the calibration sample draw.")] = 0,
    sampling: SamplingOption = "documents",
    random_prior: Annotated[
        bool,
        typer.Option(
            "--random-prior",
            help="Replace the single-block prior of the prior-guided searches (one_shot, "
            "genetic, bayesian, fast_block_select) by a seeded random ranking (control).",
        ),
    ] = False,
    option: PruneSearchOptions = None,
    out: CheckpointsOption = None,
    registry: RegistryOption = None,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
    memory_budget_gb: MemoryBudgetOption = None,
    overwrite: Annotated[
        bool,
        typer.Option(help="Replace a checkpoint directory of this run that holds a different removal set."),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON line per variant.")] = False,
    protect: ProtectOption = None,
    timing: TimingOption = "shared",
    shortcuts: Annotated[
        bool,
        typer.Option(
            "--shortcuts/--no-shortcuts",
            help="The evaluator's exact shortcuts (cached base boundaries, shared prefixes, early-stopped "
            "rankings); --no-shortcuts scores every candidate in full, to check that nothing changes.",
        ),
    ] = True,
    dry_run: DryRunOption = False,
    gpus: GpusOption = None,
    gpu_memory_gib: GpuMemoryOption = None,
    margin_clip: MarginClipOption = None,
    kl_weight: KlWeightOption = 0.0,
    truncate: TruncateOption = False,
    validation: ValidationOption = None,
    max_ppl_ratio: MaxPerplexityRatioOption = DEFAULT_MAX_PPL_RATIO,
    heal: PruneHealOption = None,
    heal_data: PruneHealDataOption = None,
) -> None:
    """Choose M blocks to remove under a calibration configuration, write and register the pruned model.

    Interrupted runs resume: re-run the same command and no subset is scored twice.
    """
    from depthprune.planning.devices import auto_device_dtype
    from pruning.calibration.config import CalibrationConfig
    from pruning.cli.groups import Placement, PruneRunOptions, SearchRequest, prune_config
    from pruning.cli.repair import patch_request
    from pruning.pipeline.prune import parse_searches
    from pruning.runtime.plans import PlanRequest

    searches = SearchRequest(parse_searches(search), option, protect, timing)
    device, dtype = auto_device_dtype(device, dtype, gpus, gpu_memory_gib)
    calibration = CalibrationConfig(
        objective, data, samples, seq_len, data_seed, sampling, margin_clip, kl_weight, truncate
    )
    run = PruneRunOptions(
        seed, random_prior, memory_budget_gb, overwrite, shortcuts, validation, max_ppl_ratio
    )
    config = prune_config(model, drop, calibration, searches, Placement(out, registry, dtype, device), run)
    repair = patch_request(heal, heal_data, config)
    _run_prune(config, PlanRequest(dry_run, gpus, gpu_memory_gib, as_json), repair)


def _run_prune(config, plan, repair=None) -> None:
    """Plan the run's memory, run every search, print one line per variant; with ``repair`` (``--heal``),
    repair the selected variant, print its line too and what the repair changed about the run's choice (on
    stderr with ``--json``)."""
    from pruning.cli.repair import choice_notes, repair_selected
    from pruning.pipeline.prune import prune as run_prune
    from pruning.runtime.plans import plan_prune_run

    config = plan_prune_run(config, plan)
    # One line per variant once every search has run: each line says whether it is the one selected.
    outcomes = list(run_prune(config))
    for outcome in outcomes:
        _print_variant(outcome, plan.as_json)
    if repair is not None and (healed := repair_selected(outcomes, repair, plan)) is not None:
        _print_healed(healed, plan.as_json)
        parent = next(outcome for outcome in outcomes if outcome.selected)
        for note in choice_notes(parent, healed, config.registry_url):
            print(f"   {note}", file=sys.stderr if plan.as_json else sys.stdout, flush=True)


# ------------------------------------------------------------------------------------------------- heal


HealDataOption = Annotated[
    str,
    typer.Option(
        help="Text to train on: pydoc, demo:text, text:PATH, c4, wikitext2, ... (its heal split when it has "
        "one, else calibration; held-out loss on the test split)."
    ),
]
"""``heal --data``."""
HealMethodOption = Annotated[
    str,
    typer.Option(
        help="lora (causal-LM loss through LoRA adapters), distill (KL from the dense model's next-token "
        "distribution), last-blocks (causal-LM loss on the LM head and the last --last-blocks blocks) or "
        "patch (no training: ReplaceMe's linear map per removed span, fused into the weights)."
    ),
]
"""``heal --method``."""
HealStepsOption = Annotated[int, typer.Option(help="Optimizer steps.")]
HealLrOption = Annotated[
    float, typer.Option("--lr", help="Peak learning rate (warm-up 5%, cosine decay to a tenth).")
]
LoraRankOption = Annotated[int, typer.Option(help="LoRA rank r (at most the hidden size).")]
LoraAlphaOption = Annotated[float, typer.Option(help="LoRA alpha (the update is scaled by alpha / r).")]
LoraTargetsOption = Annotated[
    str | None,
    typer.Option(help="Block modules that get adapters, comma-separated (default: every linear projection)."),
]
HealBatchOption = Annotated[int, typer.Option(help="Token windows per step.")]
HealSeqLenOption = Annotated[int, typer.Option(help="Tokens per window (capped at the model's context).")]
EvalDataOption = Annotated[
    str | None,
    typer.Option(help="Text whose test split gives the held-out loss (default: --data's own test split)."),
]
EvalWindowsOption = Annotated[int, typer.Option(help="Held-out windows, at most (evenly spread).")]
DistillTopKOption = Annotated[
    int | None, typer.Option(help="distill: teacher logits kept per position (default 64).")
]
LmLossWeightOption = Annotated[
    float | None, typer.Option(help="distill: weight of the causal-LM loss added to the KL (default 0).")
]
FullFinetuneOption = Annotated[
    bool,
    typer.Option("--full-finetune", help="distill: train the kept blocks themselves, not LoRA adapters."),
]
SaveEveryOption = Annotated[
    int, typer.Option(help="Save the training state every N steps (Ctrl-C saves too).")
]


def _print_healed(outcome, as_json: bool) -> None:
    """The healed variant as one JSON line, or its losses and name in words."""
    from dataclasses import asdict

    if as_json:
        print(json.dumps(asdict(outcome)), flush=True)
        return
    losses = outcome.losses
    training = (
        f", training loss {losses['train_first']:.4f} -> {losses['train']:.4f}"
        if losses.get("train") is not None
        else ""
    )
    validation = (
        f"; validation loss {outcome.parent_validation_loss:.4f} -> {outcome.validation_loss:.4f} "
        f"(the parent's objective and validation data), fit {outcome.fit}"
        if outcome.validation_loss is not None
        else ""
    )
    print(
        f"healed {outcome.parent} with {outcome.method} "
        f"({outcome.steps} steps, {outcome.wall_seconds:.1f} s): "
        f"held-out loss {losses['heldout_before']:.4f} -> {losses['heldout']:.4f}{training}{validation} "
        f"-> {outcome.name} ({outcome.checkpoint})",
        flush=True,
    )


def heal(
    variant: Annotated[str, typer.Argument(help="The pruned variant to heal: registry name, alias or id.")],
    data: HealDataOption,
    method: HealMethodOption = "lora",
    steps: HealStepsOption = 200,
    lr: HealLrOption = 1e-4,
    lora_rank: LoraRankOption = 8,
    lora_alpha: LoraAlphaOption = 16.0,
    lora_targets: LoraTargetsOption = None,
    batch_size: HealBatchOption = 8,
    seq_len: HealSeqLenOption = 512,
    eval_data: EvalDataOption = None,
    eval_windows: EvalWindowsOption = 64,
    distill_top_k: DistillTopKOption = None,
    lm_loss_weight: LmLossWeightOption = None,
    full_finetune: FullFinetuneOption = False,
    last_blocks: LastBlocksOption = None,
    estimator: EstimatorOption = None,
    ridge: RidgeOption = None,
    patch_samples: PatchSamplesOption = None,
    save_every: SaveEveryOption = 50,
    seed: SeedOption = 0,
    out: CheckpointsOption = None,
    registry: RegistryOption = None,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
    as_json: JsonOption = False,
    dry_run: DryRunOption = False,
    gpus: GpusOption = None,
    gpu_memory_gib: GpuMemoryOption = None,
) -> None:
    """Recover a pruned variant's quality (lora, distill, last-blocks or the training-free patch); register
    the result as its child.

    Every method keeps the variant's shape: adapters are merged, the patch is folded into existing weights.
    Ctrl-C is safe: run the same command again and training resumes to the same weights.
    """
    from depthprune.planning.devices import auto_device_dtype
    from pruning.healing.config import DEFAULT_LORA_TARGETS, HealConfig
    from pruning.healing.heal import heal as run_heal
    from pruning.pipeline.heldout import repaired_quality
    from pruning.runtime.plans import PlanRequest, plan_heal_run

    device, dtype = auto_device_dtype(device, dtype, gpus, gpu_memory_gib)
    config = HealConfig(
        variant=variant,
        data=data,
        method=method,
        steps=steps,
        lr=lr,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_targets=comma_list(lora_targets) if lora_targets is not None else DEFAULT_LORA_TARGETS,
        batch_size=batch_size,
        seq_len=seq_len,
        eval_data=eval_data,
        eval_windows=eval_windows,
        distill_top_k=distill_top_k,
        lm_loss_weight=lm_loss_weight,
        full_finetune=full_finetune,
        last_blocks=last_blocks,
        estimator=estimator,
        ridge=ridge,
        patch_samples=patch_samples,
        save_every=save_every,
        seed=seed,
        device=device,
        dtype=dtype,
        registry_url=registry,
        out=out,
    )
    config = plan_heal_run(config, PlanRequest(dry_run, gpus, gpu_memory_gib, as_json))
    _print_healed(run_heal(config, assess_child=repaired_quality), as_json)


# ------------------------------------------------------------------------------------------------ study


StudySearchesOption = Annotated[
    str,
    typer.Option(
        help=f"Searches, comma-separated: names, 'study' (the paper's seven: {', '.join(STUDY_SEARCHES)}) "
        "or 'all' (the seven and the structural baselines block_influence, lorp, streamline); mixable."
    ),
]
"""``study --searches``."""

StudyWorkerOption = Annotated[
    bool,
    typer.Option(
        "--worker",
        help="Be one of several workers (same arguments, same --registry) sharing the grid: claim cells "
        "one at a time from the registry's work queue; every worker writes the report once all are done.",
    ),
]
"""``study --worker`` (:mod:`pruning.study.worker`)."""

LeaseSecondsOption = Annotated[
    float,
    typer.Option(help="With --worker: a killed worker's cell is taken over after this many seconds."),
]
"""``study --lease-seconds``."""

WorkersPerGpuOption = Annotated[
    int,
    typer.Option(
        help="With --worker on CUDA: worker processes sharing one card (start that many); each plans its "
        "cells' memory for its 1/N share of the card instead of the whole card."
    ),
]
"""``study --workers-per-gpu``."""

KeepWeightsOption = Annotated[
    str,
    typer.Option(
        help="all: every variant keeps its weights. none: a variant's weight files are deleted once its "
        "evaluation is recorded (the directory keeps its pruning.json and the command that writes them "
        "again), for grids whose checkpoints would not fit on disk."
    ),
]
"""``study --keep-weights``."""

StudySeedsOption = Annotated[
    str, typer.Option(help="Seeds, comma-separated, e.g. 0,1,2: each draws its own calibration samples.")
]
StudyDataSeedOption = Annotated[
    int | None,
    typer.Option(
        help="Pin the calibration draw to this seed for every seed: the seeds then vary the search only, "
        "and a deterministic search runs once (its other seeds' cells record reused_from)."
    ),
]
StudyChoiceSeqLenOption = Annotated[
    int | None,
    typer.Option(
        help="Multiple-choice objectives: the longest question plus answer (longer prompts are cut); "
        "default --seq-len. Above the longest item no question is truncated."
    ),
]
StudyObjectivesOption = Annotated[
    str, typer.Option(help="Calibration objectives, comma-separated: perplexity, task_margin, kl.")
]
"""``study --objectives``."""

CrossControlsOption = Annotated[
    bool, typer.Option("--cross-controls", help="Run every objective on every --data source of its kind.")
]
"""``study --cross-controls``."""

StudyDataOption = Annotated[
    str | None,
    typer.Option(
        help="Calibration data specs, comma-separated; each objective uses the first of its kind "
        "(text or multiple-choice). Default: the demo data for the demo model, else c4 and "
        "commonsense170k."
    ),
]
"""``study --data``."""

RandomPriorControlOption = Annotated[
    bool,
    typer.Option(
        "--random-prior-control", help="Also run the prior-guided searches with a seeded random prior."
    ),
]
"""``study --random-prior-control``."""

StudySeqLenOption = Annotated[
    int | None,
    typer.Option(help="Calibration tokens per window (default: min(2048, the model's context))."),
]
"""``study --seq-len``: calibration window (the evaluation's is ``--eval-seq-len``)."""

StudySearchOptions = Annotated[
    list[str] | None,
    typer.Option(
        "--option", "-o", help="Search option SEARCH.KEY=VALUE or KEY=VALUE, as for prune. Repeatable."
    ),
]
"""``study --option``/``-o``: search settings, repeatable."""

StudyHealOption = Annotated[
    str | None,
    typer.Option(
        "--heal",
        help="Heal every distinct mask with METHOD:STEPS (lora:200 or distill:200; heal's other defaults) "
        "and report whether the search or the calibration still matters after healing.",
    ),
]
"""``study --heal``: heal the study's variants and compare before vs after."""

StudyHealDataOption = Annotated[
    str | None,
    typer.Option(
        help="With --heal: text to heal on (its heal split, else its calibration split; never a test split). "
        "Default: the study's text calibration data."
    ),
]
"""``study --heal-data``."""


StudyExecutorOption = Annotated[
    str,
    typer.Option(
        help="local (this process, or --worker's shared queue) or ray (one Ray task per cell; needs "
        "depthprune[ray])."
    ),
]
"""``study --executor``."""

RayAddressOption = Annotated[
    str | None,
    typer.Option(help="With --executor ray: the cluster to use (HOST:PORT); default: start a local one."),
]
"""``study --ray-address``."""


def study(
    model: ModelOption,
    drop: Annotated[str, typer.Option(help="Budgets M (blocks removed), comma-separated, e.g. 4,6.")],
    objectives: StudyObjectivesOption = "perplexity,task_margin",
    searches: StudySearchesOption = "study",
    data: StudyDataOption = None,
    seeds: StudySeedsOption = "0",
    data_seed: StudyDataSeedOption = None,
    random_prior_control: RandomPriorControlOption = False,
    cross_controls: CrossControlsOption = False,
    samples: Annotated[int, typer.Option(help="Calibration samples per configuration.")] = 64,
    seq_len: StudySeqLenOption = None,
    choice_seq_len: StudyChoiceSeqLenOption = None,
    sampling: SamplingOption = "documents",
    truncate: TruncateOption = False,
    margin_clip: MarginClipOption = None,
    option: StudySearchOptions = None,
    suite: EvalSuiteOption = "all",
    engine: Annotated[str, typer.Option(help="Evaluation engine: auto, vllm or torch.")] = "auto",
    eval_limit: EvalLimitOption = None,
    eval_windows: EvalWindowsOption = None,
    eval_seq_len: EvalSeqLenOption = 2048,
    heal_spec: StudyHealOption = None,
    heal_data: StudyHealDataOption = None,
    out: Annotated[Path, typer.Option(help="Report directory (Markdown, HTML, figures, study.json).")] = Path(
        "study"
    ),
    checkpoints: CheckpointsOption = None,
    registry: RegistryOption = None,
    dtype: DtypeOption = "auto",
    device: DeviceOption = "auto",
    protect: ProtectOption = None,
    timing: TimingOption = "standalone",
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the study's numbers as JSON at the end.")
    ] = False,
    worker: StudyWorkerOption = False,
    lease_seconds: LeaseSecondsOption = 120.0,
    workers_per_gpu: WorkersPerGpuOption = 1,
    keep_weights: KeepWeightsOption = "all",
    dry_run: DryRunOption = False,
    gpus: GpusOption = None,
    gpu_memory_gib: GpuMemoryOption = None,
    executor: StudyExecutorOption = "local",
    ray_address: RayAddressOption = None,
) -> None:
    """Run the depth-pruning study grid (objective x data x budget x search x seed), evaluate every variant,
    and write a report with the study's tables and figures.

    Resumable: cells already in the report's cells.json or in the registry are never recomputed. With
    --worker, start the same command on several machines against one PostgreSQL --registry to share the grid.
    """
    from depthprune.planning.devices import auto_device_dtype
    from pruning.cli import groups
    from pruning.runtime.plans import PlanRequest
    from pruning.study.plan import study_searches

    search_request = groups.SearchRequest(study_searches(searches), option, protect, timing)
    device, dtype = auto_device_dtype(device, dtype, gpus, gpu_memory_gib)
    config = groups.study_config(
        model,
        groups.StudyGrid(drop, objectives, data, seeds, data_seed, random_prior_control, cross_controls),
        groups.StudyCalibration(samples, seq_len, choice_seq_len, sampling, truncate, margin_clip),
        search_request,
        groups.StudyEvaluation(suite, engine, eval_limit, eval_seq_len, heal_spec, heal_data, eval_windows),
        groups.Placement(checkpoints, registry, dtype, device),
        groups.StudyRunOptions(out, not as_json, worker, lease_seconds, workers_per_gpu, keep_weights),
    )
    _run_study(config, PlanRequest(dry_run, gpus, gpu_memory_gib, as_json), executor, ray_address)


def _run_study(config, plan, executor: str, ray_address: str | None) -> None:
    """Plan the study's memory, run it on ``executor`` (local or ray), then print where its report is (or,
    with ``--json``, the report's numbers)."""
    from pruning.runtime.plans import plan_study_run
    from pruning.study.run import run_study

    memory = plan_study_run(config, plan)
    if memory is not None and memory.devices.kind == "cuda":  # each cell spreads over the planned cards
        config = dataclasses.replace(config, gpus=memory.devices.count)
    if executor == "ray":
        from pruning.study.ray_executor import run_on_ray

        report = run_on_ray(config, ray_address, memory.choices.get("gpus_per_cell", 0) if memory else 0)
    elif executor != "local":
        from depthprune.core.errors import UserError

        raise UserError(f"--executor must be local or ray, got {executor!r}")
    else:
        report = run_study(config)
    if plan.as_json:
        print((report / "study.json").read_text())
    else:
        print(f"report: {report / 'README.md'} (HTML: {report / 'report.html'})")


# ------------------------------------------------------------------------------------------ bench-evaluator
