"""Benchmark: which calibration gives the best speculative draft of a dense model? (issue 43, item 3)

What it does (every process it starts is stopped at the end):
1. prunes ``--model`` (SmolLM2-135M by default) at every M of each ``--drafts OBJECTIVE:M,M...``
   (``--search``, one_shot by default) into the registry of ``--home`` (the registry's score memo makes a
   further M of an objective cost only its validation); a rerun into the same ``--out`` reads the drafts
   from its ``drafts.json``;
2. serves, through gateways of dense and at most two more engines each (:data:`ENGINES_BESIDE_DENSE`):
   one plain draft per M (the first objective's: a draft's decode cost depends on how many blocks it has,
   not on which) to measure its cost c, the draft's TPOT over dense's under the same load; and dense with
   each draft as vLLM's draft model (``serve --speculative spec-OBJECTIVE-mM=DRAFT:K``);
3. per gateway and ``--concurrency`` level, one ``depthprune loadtest`` of its arms with the A/A control,
   in the balanced interleaved rounds of the saturation test (each ratio is to that gateway's dense);
4. per draft: the acceptance rate alpha and mean accepted length (vLLM's counters), the measured cost c
   with its interval, the Leviathan et al. projection (1 - a^(K+1)) / ((1 - a)(K c + 1)) with the measured
   c and with c = (N - M) / N (a GPU's memory-bound decode), and the measured speed-up with its 95 %
   interval; writes ``OUT/draft-study.json``, ``OUT/draft-study.md`` and ``OUT/draft-study.png`` (alpha
   and speed-up against M per objective).

Run (timings only on a quiet machine; the engines take about a minute each to start on 2 cores)::

    heavy --quiet .venv/bin/python -m benchmarks.bench_draft_study --home /tmp/demo/home --out /tmp/ds \\
        --drafts kl:8,12,15,20 --drafts perplexity:8,15 --drafts task_ce:8,15 --concurrency 1,16
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from depthprune.testing.servers import running_gateway
from loadtest.acceptance import projected_speedup, token_alpha
from loadtest.intervals import format_ratio, from_json

DATA = {"kl": "pydoc", "perplexity": "pydoc", "task_ce": "pydoc-phrase", "task_margin": "pydoc-phrase"}
"""Calibration data per objective: the demo's (Python's documentation, offline)."""
TEXT_SAMPLES = 8
CHOICE_SAMPLES = 24
SEQ_LEN = 256


@dataclass(frozen=True)
class Draft:
    """A pruned variant used as a draft."""

    objective: str
    drop: int
    name: str
    """Its registry name."""
    removed: list[int]
    num_blocks: int

    @property
    def arm(self) -> str:
        """Served name of dense with this draft."""
        return f"spec-{self.objective.replace('_', '-')}-m{self.drop}"


def plain_drafts(drafts: list[Draft]) -> dict[int, str]:
    """``M -> the draft served alone at that depth`` (the first objective's: c depends on M only)."""
    plain: dict[int, str] = {}
    for draft in drafts:
        plain.setdefault(draft.drop, draft.name)
    return plain


def prune_drafts(args: argparse.Namespace) -> list[Draft]:
    """Step 1: one one_shot search per objective and M, registered in the home's registry; the drafts an
    earlier run into the same ``--out`` pruned are read from its ``drafts.json`` instead."""
    record = args.out / "drafts.json"
    earlier = (
        {(d["objective"], d["drop"]): Draft(**d) for d in json.loads(record.read_text())}
        if record.is_file()
        else {}
    )
    wanted = [(objective, drop) for objective, drops in args.drafts.items() for drop in drops]
    if all(key in earlier for key in wanted):
        return [earlier[key] for key in wanted]
    drafts = search_drafts(args)
    record.write_text(json.dumps([asdict(draft) for draft in drafts], indent=1))
    return drafts


def search_drafts(args: argparse.Namespace) -> list[Draft]:
    """One search per objective and M (the registry's score memo makes a further M nearly free)."""
    from ground.core.objectives import OBJECTIVES, TEXT
    from pruning.calibration.config import CalibrationConfig
    from pruning.model.sources import resolve_model
    from pruning.pipeline.config import prune_config_from
    from pruning.pipeline.prune import prune

    model = resolve_model(args.model).model
    num_blocks = json.loads((Path(model) / "config.json").read_text())["num_hidden_layers"]
    drafts = []
    for objective, drops in args.drafts.items():
        text = OBJECTIVES[objective].data_kind == TEXT
        for drop in drops:
            calibration = CalibrationConfig(
                objective=objective,
                data=DATA[objective],
                samples=TEXT_SAMPLES if text else CHOICE_SAMPLES,
                seq_len=SEQ_LEN,
                seed=0,
            )
            config = prune_config_from(
                model=str(model),
                calibration=calibration,
                drop=drop,
                searches=(args.search,),
                registry_url=args.registry,
            )
            (outcome,) = prune(config)
            drafts.append(Draft(objective, drop, outcome.name, outcome.removed_blocks, num_blocks))
            print(f"{objective} M={drop}: {outcome.name} removed {outcome.removed_blocks}", file=sys.stderr)
    return drafts


ENGINES_BESIDE_DENSE = 2
"""Engines per gateway besides dense: a SmolLM2 engine holds about 4 GB here (API server, engine core, and a
worker with its 1 GiB KV cache), one with a draft 5 GB; nine at once exhausted this 23 GB machine."""


@dataclass(frozen=True)
class Session:
    """One gateway: dense and either drafts served alone (their cost) or dense with drafts (the arms)."""

    label: str
    plain: list[str]
    """Drafts served alone (registry names)."""
    speculative: list[Draft]
    """Drafts served as dense's draft model."""

    @property
    def arms(self) -> list[str]:
        """The load test's models, dense first."""
        return ["dense", *self.plain, *(draft.arm for draft in self.speculative)]


def sessions(drafts: list[Draft], beside_dense: int = ENGINES_BESIDE_DENSE) -> list[Session]:
    """Step 2's gateways: the plain drafts first, then the speculative arms, at most ``beside_dense`` each."""
    plain = list(plain_drafts(drafts).values())
    chunks = [plain[i : i + beside_dense] for i in range(0, len(plain), beside_dense)]
    planned = [Session(f"alone-{n + 1}", chunk, []) for n, chunk in enumerate(chunks)]
    arms = [drafts[i : i + beside_dense] for i in range(0, len(drafts), beside_dense)]
    return planned + [Session(f"drafting-{n + 1}", [], chunk) for n, chunk in enumerate(arms)]


def serve_options(args: argparse.Namespace, session: Session) -> tuple[str, list[str]]:
    """Step 2: ``--variants`` and the other ``serve`` options of one gateway."""
    options = ["--registry", args.registry, "--allow-unfit", "--max-model-len", "512"]
    if session.speculative:
        arms = ",".join(f"{draft.arm}={draft.name}:{args.k}" for draft in session.speculative)
        options += ["--speculative", arms]
    options += ["--vllm-arg=--enforce-eager", "--start-timeout", "1800", "--log-level", "warning"]
    return ",".join(["dense", *session.plain]), options


def held_out_prompts(out: Path) -> str:
    """The demo's load-test prompts: pydoc's test split, never calibration data (in the kl and perplexity
    drafts' domain, so their acceptance is an in-domain reading)."""
    from pruning.calibration.data.pydoc import pydoc_documents

    path = out / "prompts-pydoc-test.jsonl"
    path.write_text("".join(json.dumps({"text": doc.text}) + "\n" for doc in pydoc_documents("test")))
    return str(path)


def measure(args: argparse.Namespace, url: str, session: Session, concurrency: int) -> dict:
    """Step 3: one load test of a gateway's arms with the A/A control, ``concurrency`` in flight."""
    tag = f"{session.label}-c{concurrency}"
    arms = session.arms
    result_file = args.out / f"loadtest-{tag}.json"
    command = [sys.executable, "-m", "depthprune", "loadtest", "--target", url, "--models", ",".join(arms)]
    command += ["--aa", "--input-len", "64", "--output-len", str(args.output_len), "--prompts", args.prompts]
    command += ["--rounds", str(args.rounds), "--max-rounds", str(args.rounds), "--steady-fraction", "0"]
    command += [
        "--num-prompts",
        str(args.num_prompts if concurrency == 1 else max(concurrency, args.num_prompts)),
    ]
    command += ["--max-concurrency", str(concurrency), "--registry", args.registry, *args.loadtest_arg]
    command += [
        "--no-save-registry",
        "--save-result",
        str(result_file),
        "--report-dir",
        str(args.out / f"report-{tag}"),
    ]
    completed = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    (args.out / f"loadtest-{tag}.md").write_text(completed.stdout)
    if completed.returncode != 0:
        raise SystemExit(f"loadtest failed (exit {completed.returncode}); see {args.out}")
    return json.loads(result_file.read_text())


def draft_rows(
    result: dict, drafts: list[Draft], plain: dict[int, str], k: int, concurrency: int
) -> list[dict]:
    """Step 4: one row per draft at one concurrency level (``plain``: M -> the served draft of that depth)."""
    rows = []
    for draft in drafts:
        spec = result.get("speculative", {}).get(draft.arm, {})
        comparison = result["comparison"][draft.arm]
        alone = result["comparison"][plain[draft.drop]]
        cost = alone["ratios"].get("mean_tpot_ms")
        cost_ci = alone["ratios_ci95"].get("mean_tpot_ms")
        row = {
            **asdict(draft),
            "arm": draft.arm,
            "concurrency": concurrency,
            "k": k,
            "acceptance_rate": spec.get("acceptance_rate"),
            "mean_accepted_length": spec.get("mean_accepted_length"),
            "draft_cost": cost,
            "draft_cost_ci95": cost_ci,
            "speedup": comparison["output_throughput_speedup"],
            "speedup_ci95": comparison["output_throughput_speedup_ci95"],
        }
        rows.append(projected(row))
    return rows


def projected(row: dict) -> dict:
    """``row`` with the per-token α of its mean accepted length and Leviathan et al.'s projections from it:
    with the measured cost c (its interval from c's) and with c = (N − M)/N; whether the measured speed-up's
    interval meets the projection's (:mod:`loadtest.acceptance`: vLLM's rate is not that α)."""
    length, k = row.get("mean_accepted_length"), row["k"]
    alpha = None if length is None else token_alpha(length, k)
    cost, cost_ci = row.get("draft_cost"), row.get("draft_cost_ci95")
    block_cost = (row["num_blocks"] - row["drop"]) / row["num_blocks"]
    found = {
        "alpha_token": alpha,
        "projection_measured_cost": None
        if alpha is None or cost is None
        else projected_speedup(alpha, k, cost),
        "projection_measured_cost_ci95": None
        if alpha is None or not cost_ci
        else [projected_speedup(alpha, k, cost_ci[1]), projected_speedup(alpha, k, cost_ci[0])],
        "projection_block_cost": None if alpha is None else projected_speedup(alpha, k, block_cost),
    }
    interval, measured = found["projection_measured_cost_ci95"], row.get("speedup_ci95")
    found["projection_meets_measurement"] = (
        None if not interval or not measured else interval[0] <= measured[1] and measured[0] <= interval[1]
    )
    return {**row, **found}


def markdown(rows: list[dict], aa: dict[str, dict]) -> str:
    """The study's table, one row per draft and concurrency level, and each gateway's A/A control per level
    (``aa``: "GATEWAY, LEVEL in flight" -> the load test's ``aa`` record)."""

    def text(value, ci95=None, suffix="", digits=2):
        return format_ratio(from_json(value, ci95), suffix, digits)

    lines = [
        "| objective | M | conc. | rate | accepted length | α per token | c measured [95 %] "
        "| projected (c measured) [95 %] | projected (c = (N-M)/N) | measured speed-up [95 %] |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        cells = [
            text(row["acceptance_rate"], digits=3),
            text(row["mean_accepted_length"]),
            text(row["alpha_token"], digits=3),
            text(row["draft_cost"], row["draft_cost_ci95"]),
            text(row["projection_measured_cost"], row["projection_measured_cost_ci95"], "x"),
            text(row["projection_block_cost"], suffix="x"),
            text(row["speedup"], row["speedup_ci95"], "x"),
        ]
        lines.append(
            f"| {row['objective']} | {row['drop']} | {row['concurrency']} | " + " | ".join(cells) + " |"
        )
    for where, control in aa.items():
        ratio = text(control["output_throughput_ratio"], control["output_throughput_ratio_ci95"], "x")
        lines.append(f"\nA/A control ({where}): {ratio}")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    """alpha and the measured speed-up (with its interval) against M, a line per objective and level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for objective in dict.fromkeys(row["objective"] for row in rows):
        mine = [
            row
            for row in rows
            if row["objective"] == objective and row["concurrency"] == rows[0]["concurrency"]
        ]
        left.plot([r["drop"] for r in mine], [r["acceptance_rate"] for r in mine], "o-", label=objective)
        for concurrency in dict.fromkeys(row["concurrency"] for row in rows):
            level = [
                row for row in rows if row["objective"] == objective and row["concurrency"] == concurrency
            ]
            drops = [r["drop"] for r in level]
            speedups = [r["speedup"] for r in level]
            errors = [
                [r["speedup"] - r["speedup_ci95"][0] for r in level],
                [r["speedup_ci95"][1] - r["speedup"] for r in level],
            ]
            right.errorbar(
                drops,
                speedups,
                yerr=errors,
                marker="o",
                capsize=3,
                label=f"{objective}, {concurrency} in flight",
            )
    left.set(
        xlabel="M (blocks removed from the draft)",
        ylabel="acceptance rate (accepted / drafted)",
        title="Acceptance",
    )
    right.axhline(1.0, color="grey", linewidth=0.8)
    right.set(
        xlabel="M (blocks removed from the draft)",
        ylabel="speed-up over dense [95 %]",
        title="Measured speed-up",
    )
    left.legend()
    right.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


DEFAULT_DRAFTS = [f"{objective}:8,12,15,20" for objective in ("kl", "perplexity", "task_ce")]
"""The issue's grid: three calibrations, four depths."""


def parse_drafts(item: str, parser: argparse.ArgumentParser) -> tuple[str, list[int]]:
    """``OBJECTIVE:M,M...`` -> (objective, [M, ...]); a malformed item is a one-line usage error."""
    objective, _, drops = item.partition(":")
    if objective not in DATA:
        parser.error(f"--drafts {item!r}: unknown objective {objective!r}; choose from {', '.join(DATA)}")
    try:
        return objective, [int(part) for part in drops.split(",")]
    except ValueError:
        parser.error(f"--drafts {item!r} must look like OBJECTIVE:M,M... (e.g. kl:8,15)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The benchmark's command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--home", type=Path, help="DEPTHPRUNE_HOME holding the registry (a demo's); not with --render"
    )
    parser.add_argument("--out", type=Path, required=True, help="directory for logs and results")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument(
        "--drafts",
        action="append",
        metavar="OBJECTIVE:M,M...",
        help="drafts to prune and serve (repeatable); default: kl, perplexity and task_ce at 8,12,15,20",
    )
    parser.add_argument("--search", default="one_shot")
    parser.add_argument("--k", type=int, default=3, help="drafted tokens per step")
    parser.add_argument("--concurrency", default="1,16", help="comma-separated most requests in flight")
    parser.add_argument("--num-prompts", type=int, default=4, help="measured requests per arm and round")
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per load test (fixed)")
    parser.add_argument("--loadtest-arg", action="append", default=[], help="extra loadtest option")
    parser.add_argument(
        "--render",
        action="store_true",
        help="recompute the derived columns of OUT/draft-study.json (α per token, projections) and write "
        "its table and plot again; nothing is measured",
    )
    args = parser.parse_args(argv)
    args.drafts = dict(parse_drafts(item, parser) for item in args.drafts or DEFAULT_DRAFTS)
    args.levels = [int(part) for part in args.concurrency.split(",")]
    if args.home is None and not args.render:
        parser.error("--home is required (except with --render)")
    args.home = args.home.resolve() if args.home else None
    args.registry = f"sqlite:///{args.home / 'registry.db'}" if args.home else None
    return args


def main(argv: list[str] | None = None) -> None:
    """Run the study (steps in the module docstring)."""
    import os

    args = parse_args(argv)
    if args.render:
        render(args.out)
        return
    os.environ["DEPTHPRUNE_HOME"] = str(args.home)
    args.out.mkdir(parents=True, exist_ok=True)
    drafts = prune_drafts(args)
    args.prompts = held_out_prompts(args.out)
    plain = plain_drafts(drafts)
    merged = {level: {"comparison": {}, "speculative": {}} for level in args.levels}
    controls = {}
    for session in sessions(drafts):
        variants, options = serve_options(args, session)
        log = args.out / f"serve-{session.label}.log"
        env = {"DEPTHPRUNE_HOME": str(args.home)}
        with running_gateway(variants, log, *options, env=env, timeout_s=1800) as gateway:
            for level in args.levels:
                result = measure(args, gateway.url, session, level)
                merged[level]["comparison"].update(result["comparison"])
                merged[level]["speculative"].update(result.get("speculative") or {})
                controls[f"{session.label}, {level} in flight"] = result["aa"]
    rows = [row for level in args.levels for row in draft_rows(merged[level], drafts, plain, args.k, level)]
    summary = {
        "k": args.k,
        "search": args.search,
        "drafts": [asdict(d) for d in drafts],
        "rows": rows,
        "aa": controls,
    }
    (args.out / "draft-study.json").write_text(json.dumps(summary, indent=2))
    render(args.out)


def render(out: Path) -> None:
    """Recompute each row's derived columns (:func:`projected`) and write the JSON, table and plot."""
    summary = json.loads((out / "draft-study.json").read_text())
    summary["rows"] = [projected({"k": summary["k"], **row}) for row in summary["rows"]]
    (out / "draft-study.json").write_text(json.dumps(summary, indent=2))
    table = markdown(summary["rows"], summary["aa"])
    (out / "draft-study.md").write_text(table + "\n")
    plot(summary["rows"], out / "draft-study.png")
    print(table)


if __name__ == "__main__":
    main()
