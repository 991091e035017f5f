"""Command-line functions of the pruning side: ``demo-model``, ``checkpoint``, ``prune``,
``bench-evaluator``, ``eval`` and ``study``.

Each function's typed signature is its command line (typer). Heavy modules (torch, transformers) are
imported inside the functions so that ``depthprune --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def checkpoint(
    model: Annotated[str, typer.Option(help="Hub id or local directory of the dense model.")],
    remove: Annotated[str, typer.Option(help="Original indices of the blocks to remove, e.g. 3,7,8.")],
    out: Annotated[Path, typer.Option(help="Directory to write the pruned checkpoint to.")],
    revision: Annotated[str | None, typer.Option(help="Hub revision of the model.")] = None,
    dtype: Annotated[str | None, typer.Option(help="Save in this dtype (default: the model's own).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace OUT if it exists.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print pruning.json as one JSON line.")] = False,
) -> None:
    """Write a variant of MODEL without the given blocks as an ordinary Hugging Face checkpoint."""
    from dataclasses import asdict

    from pruning.checkpoint import write_pruned_checkpoint
    from pruning.models import parse_block_list

    written = write_pruned_checkpoint(model, parse_block_list(remove), out, revision=revision, dtype=dtype,
                                      overwrite=overwrite)
    if as_json:
        print(json.dumps(asdict(written)))
    else:
        print(f"wrote {written.path}: removed blocks {written.removed_blocks} of {written.base_num_blocks} "
              f"({written.architecture}), weights sha256 {written.weights_sha256[:12]}")


def evaluate(
    variants: Annotated[list[str], typer.Argument(
        help="Variants to evaluate: registry names, aliases, 'dense' (or dense@BASE), "
             "or checkpoint directories.")],
    suite: Annotated[str, typer.Option(
        help="perplexity (WikiText-2, C4, LAMBADA), zero-shot (HellaSwag, WinoGrande, ARC-E/C, PIQA, BoolQ), "
             "demo (the demo model's local text perplexity and QA accuracy), or all (demo suites on a demo "
             "model, else perplexity + zero-shot); comma-separated for several.")] = "all",
    registry: Annotated[str | None, typer.Option(
        help="Registry URL (default: DEPTHPRUNE_REGISTRY_URL or SQLite under DEPTHPRUNE_HOME).")] = None,
    engine: Annotated[str, typer.Option(
        help="auto (vLLM when installed, else transformers), vllm, or hf (plain torch forward).")] = "auto",
    limit: Annotated[int | None, typer.Option(
        help="At most N perplexity windows / N documents per task (quick checks; recorded).")] = None,
    seq_len: Annotated[int, typer.Option(
        help="Perplexity window length in tokens (non-overlapping; capped at the model's context).")] = 2048,
    dtype: Annotated[str, typer.Option(help="Weights dtype: float32, bfloat16 or float16.")] = "float32",
    num_fewshot: Annotated[int, typer.Option(help="Few-shot examples for lm-eval tasks (the study: 0).")] = 0,
    no_record: Annotated[bool, typer.Option("--no-record",
                                            help="Do not store the results in the registry.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
) -> None:
    """Measure perplexity and zero-shot accuracy of dense and pruned variants; record them in the registry."""
    from pruning.evaluate import EvalSettings, evaluate_variants, results_as_json
    from registry import open_registry

    settings = EvalSettings(suites=tuple(item.strip() for item in suite.split(",") if item.strip()),
                            engine=engine, dtype=dtype, seq_len=seq_len, limit=limit, num_fewshot=num_fewshot,
                            progress=not as_json)
    outcome = evaluate_variants(variants, settings, open_registry(registry), record=not no_record)
    if as_json:
        print(json.dumps(results_as_json(outcome), indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for item in outcome:
        table = Table(title=f"{item.label}" + (f" (recorded as {item.variant})" if item.variant else
                                               " (not recorded)"))
        for column in ("suite", "task", "metric", "value", "± stderr", "measured on"):
            table.add_column(column, justify="right" if column in ("value", "± stderr") else "left")
        for result in item.results:
            stderr = result.settings.get("stderr")
            detail = (f"{result.settings['windows']} × {result.settings['seq_len']} tokens"
                      if "windows" in result.settings else f"{result.settings.get('documents')} documents")
            table.add_row(result.suite, result.task, result.metric, f"{result.value:.4f}",
                          "" if stderr is None else f"{stderr:.4f}",
                          f"{detail} ({result.settings['engine']})")
        console.print(table)


def prune(
    model: Annotated[str, typer.Option(help="Hub id or local directory of the dense model.")],
    objective: Annotated[str, typer.Option(help="Calibration objective: perplexity, task_margin or kl.")],
    data: Annotated[str, typer.Option(
        help="Calibration data: c4, wikitext2, lambada, commonsense170k, demo:text, demo:qa, text:PATH or "
             "mc:PATH (its kind must suit the objective).")],
    drop: Annotated[int, typer.Option(help="M, the number of blocks to remove.")],
    search: Annotated[str, typer.Option(
        help="Search algorithm: one_shot, greedy, beam, genetic, bayesian, cbo, fast_block_select, "
             "block_influence, evolution, exhaustive; comma-separated for several, or 'all' (every one but "
             "exhaustive) on one shared evaluator.")] = "greedy",
    seed: Annotated[int, typer.Option(help="Seed of the search(es).")] = 0,
    samples: Annotated[int, typer.Option(help="Calibration samples (text windows or questions).")] = 64,
    seq_len: Annotated[int, typer.Option(help="Tokens per calibration window.")] = 2048,
    data_seed: Annotated[int, typer.Option(help="Seed of the calibration sample draw.")] = 0,
    random_prior: Annotated[bool, typer.Option(
        "--random-prior", help="Replace the single-block prior of the prior-guided searches (one_shot, "
                               "genetic, bayesian, fast_block_select) by a seeded random ranking (control).")
    ] = False,
    option: Annotated[list[str] | None, typer.Option(
        "--option", "-o", help="Search option KEY=VALUE (every selected search that has it) or "
                               "SEARCH.KEY=VALUE, e.g. -o beam.width=3 -o bayesian.trials=50 "
                               "-o bayesian.storage=postgresql+psycopg://host/db. Repeatable.")] = None,
    out: Annotated[Path | None, typer.Option(
        help="Parent directory of the pruned checkpoints (default: DEPTHPRUNE_HOME/variants).")] = None,
    registry: Annotated[str | None, typer.Option(
        help="Registry URL (default: DEPTHPRUNE_REGISTRY_URL or SQLite under DEPTHPRUNE_HOME).")] = None,
    dtype: Annotated[str, typer.Option(help="dtype the model is scored in: float32, bfloat16, float16.")
                     ] = "float32",
    device: Annotated[str, typer.Option(help="torch device of the evaluator, e.g. cpu or cuda.")] = "cpu",
    memory_budget_gb: Annotated[float | None, typer.Option(
        help="Memory the evaluator's hidden-state cache may use (default: a share of what is free).")] = None,
    overwrite: Annotated[bool, typer.Option(
        help="Replace a checkpoint directory of this run that holds a different removal set.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON line per variant.")] = False,
) -> None:
    """Choose M blocks to remove under a calibration configuration, write and register the pruned model.

    Interrupted runs resume: re-run the same command and no subset is scored twice.
    """
    from dataclasses import asdict

    from pruning.objectives import CalibrationConfig
    from pruning.prune import PruneConfig, parse_option_assignments, parse_searches
    from pruning.prune import prune as run_prune

    searches = parse_searches(search)
    config = PruneConfig(
        model=model, calibration=CalibrationConfig(objective=objective, data=data, samples=samples,
                                                   seq_len=seq_len, seed=data_seed),
        drop=drop, searches=searches, seed=seed, random_prior=random_prior,
        options=parse_option_assignments(option or [], searches), out=out, registry_url=registry, dtype=dtype,
        device=device, memory_budget_gb=memory_budget_gb, overwrite=overwrite, progress=True)

    def report(outcome) -> None:
        if as_json:
            print(json.dumps(asdict(outcome)), flush=True)
        else:
            print(f"{outcome.search}: removed {outcome.removed_blocks}, calibration loss "
                  f"{outcome.calibration_loss:.4f} (dense {outcome.dense_loss:.4f}), "
                  f"{outcome.search_seconds:.1f} s, {outcome.subset_evaluations} subsets, "
                  f"{outcome.block_forwards} block-forwards -> {outcome.name} ({outcome.checkpoint})",
                  flush=True)

    run_prune(config, on_variant=report)
