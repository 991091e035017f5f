"""Search cost: the study's panel scored naively, by today's scorer and with the exact shortcuts, in one run.

For each objective and each of the paper's seven searches (one_shot, greedy, beam, genetic, bayesian, cbo,
fast_block_select) the search runs alone on a freshly built evaluator (cold memo, standalone timing; through
``pruning.pipeline.prune.run_searches``, so the single-block prior counts for the searches that use it), once
per mode:

* ``naive`` — a full forward per candidate (SLEB): every kept block, the LM head on every position, no
  cache, no memo;
* ``today`` — the boundary cache of the dense pass, the memo and the LM head only where needed
  (``shortcuts=False``);
* ``shortcuts`` — plus the base boundaries, shared prefixes and rankings stopped at a lower bound.

Per search and mode it records the selection, the reported loss, block-forwards, LM-head positions,
candidates stopped early and the search's wall time (the evaluator's start-up, i.e. loading and the dense
reference pass, is reported apart). The three modes of a search run one after another in an order that
rotates from search to search, so that drift of a shared machine does not favour one mode; the searches run
cheapest first and ``--json`` is rewritten after each, so that a run cut short by its time box keeps what it
finished. Writes a section ``## Search cost: exact shortcuts`` into ``docs/benchmarks.md`` unless
``--no-write``; ``--from-json`` writes it from saved runs (e.g. one process per objective).

Run (the real model; 1 torch thread, since two threads on a shared 2-core machine stall each other)::

    .venv/bin/python -m benchmarks.bench_search_cost --model smollm2-135m
    .venv/bin/python -m benchmarks.bench_search_cost --model demo --no-write   # the demo model
    .venv/bin/python -m benchmarks.bench_search_cost --from-json ppl.json margin.json   # saved runs
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

from benchmarks.docs_section import DOCS, write_section
from pruning.calibration.config import CalibrationConfig
from pruning.calibration.scoring.build import build_evaluator
from pruning.pipeline.prune import canonical_model, run_searches
from pruning.search import STUDY_SEARCHES

SECTION = "## Search cost: exact shortcuts"
MODES = ("naive", "today", "shortcuts")
PANEL_ORDER = ("one_shot", "greedy", "cbo", "fast_block_select", "bayesian", "genetic", "beam")
"""The study's seven, cheapest first, so that a run cut short by its time box still has most of them."""
if set(PANEL_ORDER) != set(STUDY_SEARCHES):
    raise ImportError("PANEL_ORDER must list exactly the study's searches")
DATA = {
    "real": {"perplexity": "pydoc", "task_margin": "pydoc-cloze"},
    "demo": {"perplexity": "demo:text@{model}", "task_margin": "demo:qa@{model}"},
}


def resolve(args) -> tuple[str, str]:
    """The model directory and the data family (``real`` or ``demo``)."""
    from ground.demo.paths import find_demo_dir

    if args.model == "demo":
        from ground.demo.model import ensure_demo_model

        return str(ensure_demo_model(progress=True)), "demo"
    model = canonical_model(args.model)
    return model, "demo" if find_demo_dir(model) is not None else "real"


def run_one(model: str, config: CalibrationConfig, mode: str, search: str, args) -> dict:
    """One search alone on a fresh evaluator in one mode."""
    evaluator = build_evaluator(
        model,
        config,
        naive=mode == "naive",
        shortcuts=mode == "shortcuts",
        batch_size=args.batch_size,
        progress=False,
    )
    options = {"bayesian": {"trials": args.bayesian_trials}} if search == "bayesian" else {}
    tokens_before = evaluator.stats.tokens
    (run,) = run_searches(evaluator, args.drop, (search,), seed=args.seed, options=options, progress=False)
    return {
        "search": search,
        "mode": mode,
        "removed": list(run.result.removed_blocks),
        # Greedy's removal order explains its cost: a candidate restarts at its first removed block today.
        "order": [step["chosen"] for step in run.result.history] if search == "greedy" else None,
        "loss": run.result.loss,
        "seconds": run.seconds,
        "setup_seconds": evaluator.stats.setup_seconds,
        "block_forwards": run.block_forwards,
        # Block-forwards weighted by their batch's positions (the prior's too when the search read it).
        "block_tokens": evaluator.stats.tokens - tokens_before,
        "head_positions": run.head_positions,
        "stopped_early": run.stopped_early,
        "subsets": run.subset_evaluations,
    }


def bench_objective(model: str, family: str, objective: str, args, save=None) -> dict:
    """Every search of the panel in every mode under one objective.

    ``save(result)`` is called after each search, so that a run cut short keeps the searches it finished.
    """
    samples = args.text_samples if objective == "perplexity" else args.qa_samples
    data = DATA[family][objective].format(model=model)
    config = CalibrationConfig(objective, data, samples=samples, seq_len=args.seq_len, seed=0)
    started, load_before = time.perf_counter(), os.getloadavg()
    probe = build_evaluator(model, config, batch_size=args.batch_size, progress=False)
    result = {
        "objective": objective,
        "data": data,
        "samples": samples,
        "batches": len(probe.run_batches),
        "num_blocks": probe.num_blocks,
        "dense_loss": probe.dense_loss(),
        # Weights per block and of the LM head: the multiply-adds per position of each.
        "block_parameters": sum(parameter.numel() for parameter in probe.stack.blocks[0].parameters()),
        "head_parameters": probe.stack.lm_head.weight.numel(),
        "info": {"model": Path(model).name, "load_before": " ".join(f"{v:.1f}" for v in load_before)},
        "rows": [],
    }
    del probe
    for index, search in enumerate(args.searches):
        modes = [args.modes[(index + shift) % len(args.modes)] for shift in range(len(args.modes))]
        for mode in modes:
            row = run_one(model, config, mode, search, args)
            result["rows"].append(row)
            print(json.dumps({"objective": objective, **row}), flush=True)
        result["info"].update(
            date=time.strftime("%Y-%m-%d %H:%M %Z"),
            minutes=(time.perf_counter() - started) / 60,
            load_after=" ".join(f"{value:.1f}" for value in os.getloadavg()),
        )
        if save is not None:
            save(result)
    return result


def totals(result: dict, modes: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Per mode: block-forwards, head positions, stopped candidates, seconds and multiply-adds summed over
    the panel (multiply-adds: block weights × block positions plus head weights × head positions)."""
    summed = {}
    for mode in modes:
        rows = [row for row in result["rows"] if row["mode"] == mode]
        summed[mode] = {
            key: sum(row[key] or 0 for row in rows)
            for key in ("block_forwards", "block_tokens", "head_positions", "stopped_early", "seconds")
        }
        summed[mode]["block_macs"] = summed[mode]["block_tokens"] * result["block_parameters"]
        summed[mode]["head_macs"] = summed[mode]["head_positions"] * result["head_parameters"]
    return summed


def agreement(result: dict, search: str, modes: tuple[str, ...]) -> tuple[bool, float]:
    """Whether every mode selected the same blocks, and the largest loss difference from ``today``."""
    rows = {row["mode"]: row for row in result["rows"] if row["search"] == search}
    same = len({tuple(rows[mode]["removed"]) for mode in modes}) == 1
    reference = rows.get("today", rows[modes[0]])["loss"]
    return same, max(abs(rows[mode]["loss"] - reference) for mode in modes)


def ratio(numerator: float, denominator: float) -> str:
    return f"{numerator / denominator:.2f}×" if denominator else "–"


def objective_table(result: dict, args) -> list[str]:
    modes = tuple(args.modes)
    info = result["info"]
    lines = [
        f"**{result['objective']}** on `{result['data']}` ({result['samples']} sample(s) × ≤{args.seq_len} "
        f"tokens, {result['batches']} batch(es); N = {result['num_blocks']}, M = {args.drop}; dense loss "
        f"{result['dense_loss']:.4f}; measured {info['date']}, {info['minutes']:.1f} min with start-ups, "
        f"load average {info['load_before']} → {info['load_after']})",
        "",
        "| search | removed blocks | same in all modes | block-forwards "
        + " / ".join(modes)
        + " | LM-head positions "
        + " / ".join(modes)
        + " | stopped early | wall s "
        + " / ".join(modes)
        + " |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for search in result["searches"]:
        rows = {row["mode"]: row for row in result["rows"] if row["search"] == search}
        same, difference = agreement(result, search, modes)
        agreed = f"{'yes' if same else 'NO'} (Δloss {difference:.1e})"
        lines.append(
            f"| {search} | {rows[modes[-1]]['removed']} | {agreed} | "
            + " / ".join(f"{rows[mode]['block_forwards']:,}" for mode in modes)
            + " | "
            + " / ".join(f"{rows[mode]['head_positions']:,}" for mode in modes)
            + f" | {rows[modes[-1]]['stopped_early']} | "
            + " / ".join(f"{rows[mode]['seconds']:.1f}" for mode in modes)
            + " |"
        )
    summed = totals(result, modes)
    lines.append(
        "| **panel** | | | "
        + " / ".join(f"**{summed[mode]['block_forwards']:,}**" for mode in modes)
        + " | "
        + " / ".join(f"{summed[mode]['head_positions']:,}" for mode in modes)
        + f" | {summed[modes[-1]]['stopped_early']} | "
        + " / ".join(f"**{summed[mode]['seconds']:.1f}**" for mode in modes)
        + " |"
    )
    if {"naive", "today", "shortcuts"} <= set(modes):
        lines += ["", *panel_ratios(summed)]
    missing = [search for search in args.searches if search not in result["searches"]]
    if missing:
        lines += ["", f"Not finished within the time box (the panel above lacks them): {', '.join(missing)}."]
    return lines


def panel_ratios(summed: dict[str, dict[str, float]]) -> list[str]:
    """The panel's ratios of block-forwards, wall time and multiply-adds between the modes."""
    forwards = {mode: summed[mode]["block_forwards"] for mode in summed}
    seconds = {mode: summed[mode]["seconds"] for mode in summed}
    macs = {mode: summed[mode]["block_macs"] + summed[mode]["head_macs"] for mode in summed}
    head_share = " / ".join(f"{summed[mode]['head_macs'] / max(macs[mode], 1):.0%}" for mode in summed)
    return [
        "Panel: block-forwards naive / shortcuts = "
        f"**{ratio(forwards['naive'], forwards['shortcuts'])}** (today / shortcuts "
        f"{ratio(forwards['today'], forwards['shortcuts'])}, naive / today "
        f"{ratio(forwards['naive'], forwards['today'])}); wall time today / shortcuts = "
        f"**{ratio(seconds['today'], seconds['shortcuts'])}** (naive / shortcuts "
        f"{ratio(seconds['naive'], seconds['shortcuts'])}, naive / today "
        f"{ratio(seconds['naive'], seconds['today'])}). Multiply-adds (weights × positions, blocks and LM "
        "head) "
        + " / ".join(f"{macs[mode] / 1e12:.2f}" for mode in summed)
        + " T in "
        + " / ".join(summed)
        + f", the LM head's share {head_share}: today / shortcuts "
        f"{ratio(macs['today'], macs['shortcuts'])}, naive / shortcuts "
        f"{ratio(macs['naive'], macs['shortcuts'])}.",
    ]


def greedy_costs(order: list[int], num_blocks: int) -> dict[str, float]:
    """Blocks run per candidate and batch by greedy's steps after the first, before any early stop.

    Naive runs every kept block; today's scorer resumes from the dense boundary before the candidate's
    first removed block (so once an early block is removed every later candidate starts there); the base's
    boundaries let a candidate base ∪ {j} resume at block j.
    """
    costs = {"naive": 0, "today": 0, "shortcuts": 0}
    candidates = 0
    for step in range(1, len(order)):
        base = set(order[:step])
        for block in range(num_blocks):
            if block in base:
                continue
            removed = base | {block}
            kept = [index for index in range(num_blocks) if index not in removed]
            costs["naive"] += len(kept)
            costs["today"] += sum(index > min(removed) for index in kept)
            costs["shortcuts"] += sum(index > block for index in kept)
            candidates += 1
    return {mode: cost / max(candidates, 1) for mode, cost in costs.items()}


def greedy_reading(result: dict) -> str:
    """Why greedy costs what it does: its removal order and the blocks per candidate it implies."""
    row = next((row for row in result["rows"] if row["search"] == "greedy" and row.get("order")), None)
    if row is None:
        return ""
    costs = greedy_costs(row["order"], result["num_blocks"])
    return (
        f" Greedy removed the blocks in the order {row['order']}; after its first step a candidate costs, "
        f"per batch and before any early stop, {costs['naive']:.1f} blocks naive, {costs['today']:.1f} "
        "today (it restarts each from the dense boundary at its first removed block) and "
        f"{costs['shortcuts']:.1f} from the base's boundary at j (plus the LM head, once per candidate and "
        "batch in every mode)."
    )


def reading(results: list[dict], args) -> list[str]:
    """The goals of issue 19 checked against the panel totals, and why a ratio is what it is."""
    if not {"naive", "today", "shortcuts"} <= set(args.modes):
        return []
    lines = [
        "Goals (issue 19: at least 5× fewer block-forwards than naive, 2× less wall time than today):",
        "",
    ]
    for result in results:
        summed = totals(result, tuple(args.modes))
        forwards = summed["naive"]["block_forwards"] / max(summed["shortcuts"]["block_forwards"], 1)
        seconds = summed["today"]["seconds"] / max(summed["shortcuts"]["seconds"], 1e-9)
        same = all(agreement(result, search, tuple(args.modes))[0] for search in result["searches"])
        lines.append(
            f"- {result['objective']}: {forwards:.2f}× fewer block-forwards than naive "
            f"({'met' if forwards >= 5 else 'not met'}), {seconds:.2f}× less wall time than today "
            f"({'met' if seconds >= 2 else 'not met'}); selections "
            f"{'identical' if same else 'NOT identical'} in all three modes." + greedy_reading(result)
        )
    lines += [
        "",
        "Why the ratios are what they are: a candidate base ∪ {j} of greedy or beam now runs from block j, "
        "where today's scorer restarts it from the dense boundary before its first removed block (which is "
        "early once greedy or beam removed an early block); the LM head still runs once per candidate and "
        "batch, and its weights are those of several blocks, so wall time falls less than block-forwards. "
        "A candidate still runs every kept block past j, about half the stack on average, so an exact "
        "scheme that runs its candidates to the end saves at most about half of naive's block-forwards for "
        "greedy and beam; 5× needs most candidates stopped by the bound. "
        "Early stopping needs a per-sample floor: a perplexity candidate with b of B batches scored "
        "stops only when its loss exceeds B/b times the best one, so it mostly cuts the clearly bad "
        "candidates, and the task margin (no floor) never stops. Naive also pays for every repeat that the "
        "memo answers (BO and GA revisit sets) and for the LM head on every position. Searches that need "
        "values (genetic, bayesian, cbo, fast_block_select) gain only from trie nodes that earlier sets "
        "of the same run left in the cache.",
    ]
    return lines


def finished(result: dict, args) -> dict:
    """``result`` with only the searches run in every mode (a run cut short keeps those), listed."""
    done = [
        search
        for search in args.searches
        if {row["mode"] for row in result["rows"] if row["search"] == search} >= set(args.modes)
    ]
    rows = [row for row in result["rows"] if row["search"] in done]
    return {**result, "searches": done, "rows": rows}


def section(results: list[dict], args) -> str:
    results = [finished(result, args) for result in results]
    first = results[0]
    trials = "the study's" if args.bayesian_trials >= 200 else "the study's 200 reduced to fit the time box"
    header = (
        f"`python -m benchmarks.bench_search_cost` on `{args.model}` (`{first['info']['model']}`), float32, "
        f"{args.threads} torch thread(s) on {platform.machine()}, M = {args.drop}, seed {args.seed}, "
        f"bayesian {args.bayesian_trials} trials ({trials}), other searches at the study's settings; "
        f"batch size {args.batch_size}. A block holds {first['block_parameters'] / 1e6:.2f} M weights, "
        f"the LM head {first['head_parameters'] / 1e6:.2f} M. The calibration is small so that the three "
        "modes of both panels fit about an hour of a shared machine: the blocks a candidate runs do not "
        "depend on its size, wall times scale with it, and which blocks a search removes (hence where "
        "today's scorer restarts its candidates) may change with it. The load average is that of a machine "
        "shared with other jobs: wall times are noisy, block-forwards are not."
    )
    commands = sorted({result["info"]["command"] for result in results})
    command = (
        "Command" + ("s" if len(commands) > 1 else "") + ":\n\n" + "\n".join(f"    {c}" for c in commands)
    )
    explain = (
        "Each search runs alone on a fresh evaluator (cold memo) in each mode: *naive* is a full forward per "
        "candidate (SLEB: every kept block, the LM head on every position, no memo); *today* is the boundary "
        "cache of the dense pass plus the memo (`--no-shortcuts`); *shortcuts* adds the boundaries of the "
        "sets greedy and beam extend, shared prefixes (a trie of removal sets, nodes kept within the cache "
        "budget) and, where only a ranking is needed, stopping a candidate once a lower bound of its loss "
        "exceeds the k-th best (perplexity and KL only: a margin has no floor). Wall seconds are the "
        "search's own, the prior's included where used; start-up (load, dense pass) is excluded. "
        "*Stopped early* counts the candidates answered with a lower bound."
    )
    parts = [SECTION, "", header, "", command, "", explain, ""]
    for result in results:
        parts += objective_table(result, args) + [""]
    parts += reading(results, args)
    return "\n".join(parts)


RENDERED = (
    "model", "drop", "searches", "modes", "text_samples", "qa_samples", "seq_len", "batch_size",
    "bayesian_trials", "seed", "threads",
)  # fmt: skip
"""The settings the section shows: equal in every file ``--from-json`` combines."""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="smollm2-135m, a model directory, or demo")
    parser.add_argument("--drop", type=int, default=None, help="M (default: a quarter of the blocks)")
    parser.add_argument("--objectives", default="perplexity,task_margin")
    parser.add_argument("--searches", default=",".join(PANEL_ORDER))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--text-samples", type=int, default=4)
    parser.add_argument("--qa-samples", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--bayesian-trials", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--json", type=Path, default=None, help="also write every row here (after each objective)"
    )
    parser.add_argument(
        "--from-json",
        type=Path,
        nargs="+",
        default=None,
        help="write the section from saved runs, running nothing",
    )
    parser.add_argument("--no-write", action="store_true", help="do not touch docs/benchmarks.md")
    args = parser.parse_args(argv)
    args.objectives = [name for name in args.objectives.split(",") if name]
    args.searches = [name for name in args.searches.split(",") if name]
    args.modes = [name for name in args.modes.split(",") if name]
    return args


def load_saved(args) -> list[dict]:
    """The results of the runs saved with ``--json``, their settings copied into ``args``."""
    saved = [json.loads(path.read_text()) for path in args.from_json]
    # The order of the searches is the first run's; later runs may have run them in another.
    settings = [{**{key: run["args"][key] for key in RENDERED}, "searches": None} for run in saved]
    if len({frozenset(run["args"]["searches"]) for run in saved}) > 1:
        raise SystemExit("the saved runs ran different searches")
    if any(setting != settings[0] for setting in settings):
        raise SystemExit(f"the saved runs differ in their settings: {settings}")
    for key, value in {**settings[0], "searches": saved[0]["args"]["searches"]}.items():
        setattr(args, key, value)
    return [result for run in saved for result in run["results"]]


def run_all(args, argv) -> list[dict]:
    """Every objective of ``args``, saved to ``--json`` after each search."""
    torch.set_num_threads(args.threads)
    model, family = resolve(args)
    from pruning.model.blocks import load_config

    num_blocks = int(load_config(model).num_hidden_layers)
    args.drop = args.drop or max(1, math.floor(num_blocks / 4))
    command = shlex.join([".venv/bin/python", "-m", "benchmarks.bench_search_cost", *argv])
    results: list[dict] = []

    def save(result: dict) -> None:
        result["info"]["command"] = command
        if args.json:
            saved = {"args": {key: getattr(args, key) for key in RENDERED}, "results": [*results, result]}
            args.json.write_text(json.dumps(saved, indent=1))

    for objective in args.objectives:
        results.append(bench_objective(model, family, objective, args, save))
    return results


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    results = load_saved(args) if args.from_json else run_all(args, argv)
    text = section(results, args)
    print(text)
    if not args.no_write:
        write_section(SECTION, text, DOCS)


if __name__ == "__main__":
    main()
