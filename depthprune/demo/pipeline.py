"""``depthprune demo``: the whole job end to end on the embedded demo model.

Builds (or reuses) the demo model, prunes it under both calibration objectives with a fast and a thorough
search, registers and evaluates every variant, serves dense and the best variant of each objective
through the gateway with vLLM, load-tests them side by side, and prints one table. Every process it starts
is stopped on the way out, Ctrl-C included.

Run: ``depthprune demo`` (``make demo``), or ``depthprune demo --recipe tiny --quick`` for a smoke run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from depthprune.errors import UserError
from depthprune.settings import default_registry_url, home_dir

OBJECTIVE_DATA = {"perplexity": "demo:text", "task_margin": "demo:qa"}
"""The two calibration configurations of the study, on the demo model's stand-in data."""
BEST_ALIAS = {"perplexity": "ppl-best", "task_margin": "margin-best"}


@dataclass
class DemoConfig:
    """What the demo runs; the defaults finish in under 20 minutes on 2 cores."""

    recipe: str = "default"
    """Demo model recipe: ``default`` (16 blocks, trained once and cached) or ``tiny`` (seconds)."""
    drop_fraction: float = 0.25
    """Fraction of blocks to remove (rounded to the nearest whole block, at least one)."""
    fast_search: str = "one_shot"
    """The fast search (one evaluation per block)."""
    thorough_search: str = "greedy"
    """The thorough search (SLEB's iterative elimination)."""
    samples: int = 32
    """Calibration samples per objective."""
    seq_len: int = 128
    """Calibration sequence length in tokens."""
    num_prompts: int = 48
    """Load test: measured requests per model and round."""
    output_len: int = 64
    """Load test: generated tokens per request (ignore_eos)."""
    rounds: int = 2
    """Load test: interleaved rounds (drift between models cancels)."""
    port: int = 8765
    """Gateway port (loopback only)."""
    out: Path = field(default_factory=lambda: home_dir() / "demo")
    """Where the load-test report, its plots and the summary go."""
    registry_url: str | None = None
    """Registry URL; None = the default."""
    started: float = field(default_factory=time.monotonic, compare=False)
    """``time.monotonic()`` when the demo began (each step heading shows the minutes since)."""

    def __post_init__(self):
        if self.recipe not in ("default", "tiny"):
            raise UserError(f"unknown recipe {self.recipe!r}; use default or tiny")
        if not 0 < self.drop_fraction < 1:
            raise UserError(f"--drop-fraction must be between 0 and 1, got {self.drop_fraction}")
        for name, value in (
            ("--samples", self.samples),
            ("--seq-len", self.seq_len),
            ("--num-prompts", self.num_prompts),
            ("--output-len", self.output_len),
            ("--rounds", self.rounds),
        ):
            if value < 1:
                raise UserError(f"{name} must be at least 1, got {value}")
        if not 1024 <= self.port <= 65535:
            raise UserError(f"--port must be in 1024..65535, got {self.port}")


def say(config: DemoConfig, message: str) -> None:
    """A step heading with the minutes since the demo started, on stderr so ``--json`` output stays clean."""
    minutes, seconds = divmod(int(time.monotonic() - config.started), 60)
    print(f"\n== [{minutes}:{seconds:02d}] {message}", file=sys.stderr, flush=True)


def build_model(config: DemoConfig) -> Path:
    from depthprune.demo.model import ensure_demo_model, read_quality
    from depthprune.demo.recipe import DemoRecipe

    recipe = DemoRecipe.tiny() if config.recipe == "tiny" else DemoRecipe()
    say(config, f"demo model ({config.recipe} recipe; built once, then reused from the cache)")
    directory = ensure_demo_model(recipe, progress=True)
    quality = read_quality(directory)
    print(f"   {directory}\n   {json.dumps(quality)[:300]}", file=sys.stderr)
    return directory


def prune_variants(config: DemoConfig, model_dir: Path, registry) -> dict[str, list]:
    """``objective -> [VariantOutcome of the fast search, of the thorough search]``; aliases the best."""
    from transformers import AutoConfig

    from pruning.calibration.objectives import CalibrationConfig
    from pruning.prune import PruneConfig, prune

    num_blocks = AutoConfig.from_pretrained(model_dir).num_hidden_layers
    drop = max(1, round(num_blocks * config.drop_fraction))
    outcomes = {}
    for objective, data in OBJECTIVE_DATA.items():
        say(
            config,
            f"prune {drop} of {num_blocks} blocks: {objective} on {data} "
            f"({config.fast_search}, then {config.thorough_search})",
        )
        calibration = CalibrationConfig(
            objective=objective,
            data=f"{data}@{model_dir}",
            samples=config.samples,
            seq_len=config.seq_len,
            seed=0,
        )
        outcomes[objective] = prune(
            PruneConfig(
                model=str(model_dir),
                calibration=calibration,
                drop=drop,
                searches=(config.fast_search, config.thorough_search),
                registry_url=config.registry_url,
            )
        )
        best = min(outcomes[objective], key=lambda outcome: outcome.calibration_loss)
        registry.set_alias(BEST_ALIAS[objective], best.name)
        print(f"   {BEST_ALIAS[objective]} -> {best.name} (removed {best.removed_blocks})", file=sys.stderr)
    return outcomes


def evaluate(config: DemoConfig, names: list[str], registry) -> None:
    from pruning.evaluation.suites import EvalSettings, evaluate_variants

    say(config, f"evaluate {len(names)} models on the demo suites (held-out text perplexity, QA accuracy)")
    evaluate_variants(names, EvalSettings(suites=("demo",), engine="torch"), registry)


@contextlib.contextmanager
def gateway(config: DemoConfig, served: list[str], log_path: Path):
    """Run ``depthprune serve`` in its own process group until the block exits; yields its URL."""
    command = [
        sys.executable,
        "-m",
        "depthprune",
        "serve",
        "--variants",
        ",".join(served),
        "--port",
        str(config.port),
        "--json",
    ]
    if config.registry_url:
        command += ["--registry", config.registry_url]
    say(
        config,
        f"serve {', '.join(served)} through the gateway (one vLLM engine each, started one after another)",
    )
    log = log_path.open("w")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
    try:
        line = process.stdout.readline()  # serve prints one JSON line once every backend is up
        if not line:
            process.wait(timeout=30)
            tail = "".join(log_path.read_text().splitlines(keepends=True)[-15:])
            raise UserError(f"the gateway did not start (exit {process.returncode}); its log ends:\n{tail}")
        url = json.loads(line)["url"]
        print(f"   gateway at {url} (log: {log_path})", file=sys.stderr)
        yield url
    finally:
        stop_process_group(process)
        log.close()


def stop_process_group(process: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGINT (serve stops its vLLM engines cleanly), then SIGKILL whatever of the group is left."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def load_test(config: DemoConfig, url: str, served: list[str], model_dir: Path) -> dict:
    say(
        config,
        f"load test: {config.rounds} interleaved rounds of {config.num_prompts} requests x "
        f"{config.output_len} tokens per model, all at once",
    )
    result_path = config.out / "loadtest.json"
    command = [
        sys.executable,
        "-m",
        "depthprune",
        "loadtest",
        "--target",
        url,
        "--models",
        ",".join(served),
        "--num-prompts",
        str(config.num_prompts),
        "--output-len",
        str(config.output_len),
        "--rounds",
        str(config.rounds),
        "--rate",
        "inf",
        "--warmup",
        "2",
        "--prompts",
        "demo",
        "--tokenizer",
        str(model_dir),
        "--save-result",
        str(result_path),
        "--report-dir",
        str(config.out / "loadtest"),
    ]
    if config.registry_url:
        command += ["--registry", config.registry_url]
    completed = subprocess.run(command, stdout=subprocess.DEVNULL, text=True)
    if completed.returncode != 0:
        raise UserError(f"the load test failed (exit {completed.returncode}); see the messages above")
    return json.loads(result_path.read_text())


def summary_rows(outcomes: dict[str, list], registry, loadtest: dict, served: list[str]) -> list[dict]:
    """One row per variant (dense first): what the final table and ``--json`` show."""
    comparison = loadtest.get("comparison", {})
    by_alias = {registry.resolve(alias).name: alias for alias in served if alias != "dense"}
    rows = [
        {
            "variant": "dense",
            "name": "dense",
            "removed_blocks": [],
            "objective": "-",
            "search": "-",
            "calibration_loss": None,
            **evaluation_metrics(registry, "dense"),
            **speed_columns(None),
        }
    ]
    for objective, items in outcomes.items():
        for outcome in items:
            alias = by_alias.get(outcome.name)
            rows.append(
                {
                    "variant": alias or f"#{outcome.id}",
                    "name": outcome.name,
                    "removed_blocks": outcome.removed_blocks,
                    "objective": objective,
                    "search": outcome.search,
                    "calibration_loss": outcome.calibration_loss,
                    **evaluation_metrics(registry, outcome.name),
                    **speed_columns(comparison.get(alias) if alias else None),
                }
            )
    return rows


def evaluation_metrics(registry, name: str) -> dict:
    values = {(item.task, item.metric): item.value for item in registry.evaluations(name)}
    perplexity = next((v for (task, metric), v in values.items() if metric == "perplexity"), None)
    accuracy = next((v for (task, metric), v in values.items() if metric == "acc"), None)
    return {"perplexity": perplexity, "qa_accuracy": accuracy}


def speed_columns(comparison: dict | None) -> dict:
    """Throughput and latency ratios to dense from the load test's comparison entry, if served."""
    if comparison is None:
        return dict.fromkeys(
            (
                "output_throughput_ratio",
                "median_e2el_ratio",
                "p99_e2el_ratio",
                "ideal_speedup",
                "fraction_of_ideal_speedup",
            )
        )
    ratios = comparison["ratios"]
    return {
        "output_throughput_ratio": ratios.get("output_throughput"),
        "median_e2el_ratio": ratios.get("median_e2el_ms"),
        "p99_e2el_ratio": ratios.get("p99_e2el_ms"),
        "ideal_speedup": comparison.get("ideal_speedup"),
        "fraction_of_ideal_speedup": comparison.get("fraction_of_ideal_speedup"),
    }


def print_table(rows: list[dict], out: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    def fmt(value, digits=3):
        if value is None:
            return "-"
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    table = Table(title="depthprune demo: every variant against dense")
    for column in (
        "variant",
        "removed",
        "objective",
        "search",
        "calib. loss",
        "ppl",
        "QA acc",
        "out tok/s ×",
        "p50 E2E ×",
        "p99 E2E ×",
        "ideal ×",
        "of ideal",
    ):
        table.add_column(column, justify="left" if column in ("variant", "objective", "search") else "right")
    for row in rows:
        table.add_row(
            row["variant"],
            ",".join(map(str, row["removed_blocks"])) or "-",
            row["objective"],
            row["search"],
            fmt(row["calibration_loss"]),
            fmt(row["perplexity"], 2),
            fmt(row["qa_accuracy"]),
            fmt(row["output_throughput_ratio"], 2),
            fmt(row["median_e2el_ratio"], 2),
            fmt(row["p99_e2el_ratio"], 2),
            fmt(row["ideal_speedup"], 2),
            fmt(row["fraction_of_ideal_speedup"], 2),
        )
    # Wide enough for every column even when stderr is a pipe (CI logs, `make demo | tee`).
    console = Console(stderr=True, width=max(Console(stderr=True).width, 160))
    console.print(table)
    console.print(f"report and plots: {out / 'loadtest'}; summary: {out / 'summary.json'}")
    console.print(
        "#N = registry id (`depthprune variants show N`); "
        "× = ratio to dense under the same load (throughput: higher is better; latency: lower)."
    )


def run_demo(config: DemoConfig) -> list[dict]:
    """Run every step; returns the final table's rows."""
    from registry import open_registry

    config.out.mkdir(parents=True, exist_ok=True)
    registry = open_registry(config.registry_url or default_registry_url())
    model_dir = build_model(config)
    outcomes = prune_variants(config, model_dir, registry)
    evaluate(config, ["dense", *[outcome.name for items in outcomes.values() for outcome in items]], registry)
    served = ["dense", *BEST_ALIAS.values()]
    with gateway(config, served, config.out / "serve.log") as url:
        loadtest = load_test(config, url, served, model_dir)
    rows = summary_rows(outcomes, registry, loadtest, served)
    (config.out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    print_table(rows, config.out)
    return rows


def demo(
    recipe: Annotated[
        str, typer.Option(help="Demo model recipe: default (16 blocks) or tiny (seconds).")
    ] = "default",
    quick: Annotated[
        bool, typer.Option(help="Smaller calibration and load (a smoke run, e.g. in CI).")
    ] = False,
    port: Annotated[int, typer.Option(help="Gateway port on 127.0.0.1.")] = 8765,
    out: Annotated[
        Path | None, typer.Option(help="Report directory [default: DEPTHPRUNE_HOME/demo].")
    ] = None,
    registry: Annotated[
        str | None, typer.Option(help="Registry URL [default: SQLite in DEPTHPRUNE_HOME].")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the final table as one JSON line.")] = False,
) -> None:
    """Build the demo model, prune it under both objectives, evaluate, serve with vLLM and load-test it."""
    settings = dict(recipe=recipe, port=port, registry_url=registry)
    if out is not None:
        settings["out"] = out
    if quick:
        settings.update(samples=8, seq_len=64, num_prompts=8, output_len=16, rounds=1)
    config = DemoConfig(**settings)
    rows = run_demo(config)
    print(f"demo finished in {time.monotonic() - config.started:.0f} s", file=sys.stderr)
    if as_json:
        print(json.dumps(rows))
