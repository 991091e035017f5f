"""Real-model benchmarks: SmolLM2-135M-Instruct (30 blocks) pruned, evaluated and healed on Python's docs.

Every figure of the "SmolLM2-135M" sections of docs/benchmarks.md comes from one ``depthprune`` command that
this script runs as a subprocess and records: the exact command line, the wall time, the load average
before and after, the torch thread count and the command's ``--json`` output, as
``RESULTS/<stage>.json`` (``RESULTS`` is ``DEPTHPRUNE_HOME/bench-real-model`` unless ``--results``).
A stage whose record exists is skipped, so an interrupted session goes on where it stopped; ``--force``
runs it again. The stages, in order:

* ``searches-perplexity``, ``searches-task_margin``: ``depthprune prune`` of M = 8 of 30 blocks with the
  one-pass and cheap searches on one shared evaluator (perplexity on ``pydoc``'s calibration split,
  8 windows × 256 tokens; task margin on ``pydoc-cloze``'s, 32 questions);
* ``quality``: ``depthprune eval MODEL --suite offline`` of dense and of the one_shot, lorp and best
  variants of each objective, one command per model (pydoc test perplexity, 2,048-token windows; cloze
  accuracy); ``quality-best``: of dense and each objective's best variant only;
* ``evaluator-perplexity``, ``evaluator-task_margin``: ``depthprune bench-evaluator`` (fast vs naive);
* ``heal-perplexity``, ``heal-task_margin``: ``depthprune heal`` of the objective's best variant with
  ``lora`` and with ``distill`` on pydoc's heal split, then ``depthprune eval`` of each healed variant;
* ``loadtest``: ``python -m benchmarks.bench_loadtest`` through the gateway, dense, the perplexity objective's
  best variant and its LoRA-healed child side by side in one run (eager vLLM, 512-token context);
* ``write``: the Markdown sections, into docs/benchmarks.md (``--no-write``: print them only); they are
  composed in ``benchmarks.real_model_report`` from the records ``benchmarks.real_model_setup`` reads.

Run on the 2-core machine (one torch thread: under contention two threads are several times slower)::

    export DEPTHPRUNE_HOME=/work/bench-home OMP_NUM_THREADS=1
    heavy .venv/bin/python -m benchmarks.bench_real_model searches-perplexity searches-task_margin
    heavy .venv/bin/python -m benchmarks.bench_real_model quality-best heal-perplexity write
    heavy .venv/bin/python -m benchmarks.bench_real_model evaluator-perplexity evaluator-task_margin
    unset OMP_NUM_THREADS; heavy .venv/bin/python -m benchmarks.bench_real_model loadtest write
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.real_model_report import (
    write,
)
from benchmarks.real_model_setup import (
    CALIBRATION,
    DROP,
    EVAL_FLAGS,
    EVALUATOR_DATA,
    EVALUATOR_FLAGS,
    GENETIC_OPTIONS,
    HEAL_FLAGS,
    HEAL_METHODS,
    HEAL_SEARCH,
    HEAL_STEPS,
    LOADTEST_FLAGS,
    LOADTEST_HEALED,
    LOADTEST_MODULE,
    LOADTEST_NAMES,
    MODEL,
    REPOSITORY,
    SEARCHES,
    Results,
    heal_outcome,
    loadavg,
)


def parse_output(stdout: str):
    """A command's ``--json`` output: one JSON document, or one object per line (``prune``)."""
    text = stdout.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def run_command(
    stage: str,
    arguments: list[str],
    results: Path,
    force: bool,
    script: str | None = None,
    read_output: Callable[[], object] | None = None,
) -> dict:
    """Run ``depthprune ARGUMENTS`` once and record it as ``RESULTS/<stage>.json`` (reused unless forced).

    Args:
        stage: the record's name.
        arguments: the command line after ``depthprune`` (or after ``script``).
        results: the results directory.
        force: run again although a record exists.
        script: run this benchmark module (``benchmarks.NAME``, as ``python -m``) instead of ``depthprune``.
        read_output: what the record keeps as output, read once the command ended (default: its stdout
            parsed as ``--json`` output; with it, stdout goes to the log).

    Returns:
        The record: command, start time, wall seconds, load before and after, threads, output.
    """
    path = results / f"{stage}.json"
    if path.is_file() and not force:
        return json.loads(path.read_text())
    command = [".venv/bin/python", "-m", script, *arguments] if script else ["depthprune", *arguments]
    program = ["-m", script or "depthprune"]
    print(f"[{stage}] {' '.join(command)}", file=sys.stderr, flush=True)
    record = {
        "stage": stage,
        "command": " ".join(command),
        "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load_before": loadavg(),
        "torch_threads": os.environ.get("OMP_NUM_THREADS", "default"),
    }
    started = time.perf_counter()
    with open(results / f"{stage}.log", "w") as log:
        finished = subprocess.run(
            [sys.executable, *program, *arguments],
            stdout=log if read_output else subprocess.PIPE,
            stderr=log,
            text=True,
            cwd=REPOSITORY,
        )
    record["wall_seconds"] = round(time.perf_counter() - started, 1)
    record["load_after"] = loadavg()
    if finished.returncode != 0:
        raise SystemExit(f"[{stage}] failed ({finished.returncode}); see {results / f'{stage}.log'}")
    record["output"] = read_output() if read_output else parse_output(finished.stdout)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def searches(objective: str, results: Path, force: bool) -> dict:
    """``prune`` of M = 8 under ``objective`` with :data:`SEARCHES` on one shared evaluator."""
    data, samples, seq_len = CALIBRATION[objective]
    arguments = ["prune", "--model", MODEL, "--objective", objective, "--data", data, "--drop", str(DROP)]
    arguments += ["--samples", str(samples), "--seq-len", str(seq_len), "--search", SEARCHES]
    return run_command(f"searches-{objective}", [*arguments, *GENETIC_OPTIONS, "--json"], results, force)


def quality(results: Path, force: bool, best_only: bool = False) -> None:
    """``eval --suite offline`` of dense and of each objective's :data:`QUALITY_SEARCHES` variants
    (``best_only``: of dense and each objective's best variant)."""
    found = Results(results)
    names = found.quality_names()
    if best_only:
        ran = [objective for objective in CALIBRATION if found.variants(objective)]
        names = [MODEL] + [found.variant(objective, "best")["name"] for objective in ran]
    for name in names:
        run_command(f"quality-{name}", ["eval", name, *EVAL_FLAGS], results, force)


def evaluator(objective: str, results: Path, force: bool) -> dict:
    """``bench-evaluator`` on the real model: fast vs naive on single-block and random M = 8 sets.

    ``bench-evaluator --model`` takes a directory or hub id only (not ``smollm2-135m``), so it gets the
    converted checkpoint that ``smollm2-135m`` resolves to.
    """
    from pruning.model.sources import resolve_model

    checkpoint = resolve_model(MODEL).model
    arguments = ["bench-evaluator", "--model", str(checkpoint), "--objective", objective]
    data, samples = EVALUATOR_DATA[objective]
    arguments += ["--data", data, "--samples", str(samples), *EVALUATOR_FLAGS, "--json"]
    return run_command(f"evaluator-{objective}", arguments, results, force)


def heal(objective: str, results: Path, force: bool) -> None:
    """``heal`` of the objective's :data:`HEAL_SEARCH` variant with each method, then ``eval`` of it."""
    parent = Results(results).variant(objective, HEAL_SEARCH)["name"]
    for method in HEAL_METHODS:
        steps = ["--steps", str(HEAL_STEPS[method])]
        arguments = ["heal", parent, "--method", method, *steps, *HEAL_FLAGS, "--json"]
        record = run_command(f"heal-{objective}-{method}", arguments, results, force)
        healed = heal_outcome(record)["name"]
        run_command(f"quality-{healed}", ["eval", healed, *EVAL_FLAGS], results, force)


def loadtest(results: Path, force: bool) -> dict:
    """``benchmarks.bench_loadtest`` through the gateway: dense, the perplexity objective's best variant
    and its :data:`LOADTEST_HEALED` children, interleaved in one run."""
    found = Results(results)
    served = {LOADTEST_NAMES["pruned"]: found.variant("perplexity", HEAL_SEARCH)["checkpoint"]}
    for method in LOADTEST_HEALED:
        record = found.record(f"heal-perplexity-{method}")
        if record is not None:
            served[LOADTEST_NAMES[method]] = heal_outcome(record)["checkpoint"]
    out = results / "loadtest"
    arguments = ["--model", MODEL, *LOADTEST_FLAGS, "--out", str(out)]
    for name, checkpoint in served.items():
        arguments += ["--variant", f"{name}={checkpoint}"]

    def read_output() -> dict:
        summary = json.loads((out / "summary.json").read_text())
        result = json.loads((out / "loadtest_result.json").read_text())
        return {"summary": summary, "models": result["models"], "comparison": result["comparison"]}

    return run_command("loadtest", arguments, results, force, LOADTEST_MODULE, read_output)


STAGES = {
    "searches-perplexity": lambda args: searches("perplexity", args.results, args.force),
    "searches-task_margin": lambda args: searches("task_margin", args.results, args.force),
    "quality": lambda args: quality(args.results, args.force),
    "quality-best": lambda args: quality(args.results, args.force, best_only=True),
    "evaluator-perplexity": lambda args: evaluator("perplexity", args.results, args.force),
    "evaluator-task_margin": lambda args: evaluator("task_margin", args.results, args.force),
    "heal-perplexity": lambda args: heal("perplexity", args.results, args.force),
    "heal-task_margin": lambda args: heal("task_margin", args.results, args.force),
    "loadtest": lambda args: loadtest(args.results, args.force),
    "write": lambda args: write(args.results, args.no_write),
}
"""Stage name -> what it runs, given the parsed command line."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stages", nargs="+", choices=STAGES, help="what to run, in order")
    parser.add_argument(
        "--results", type=Path, help="records directory (default DEPTHPRUNE_HOME/bench-real-model)"
    )
    parser.add_argument("--force", action="store_true", help="run stages again although their records exist")
    parser.add_argument("--no-write", action="store_true", help="print the sections, do not edit the docs")
    args = parser.parse_args()
    from ground.core.settings import home_dir

    args.results = args.results or home_dir() / "bench-real-model"
    args.results.mkdir(parents=True, exist_ok=True)
    for stage in args.stages:
        STAGES[stage](args)


if __name__ == "__main__":
    main()
