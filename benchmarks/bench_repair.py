"""Repair measured like speed (issue 41): heal each parent by each method, judge all on the offline suite.

On a home where ``make demo`` left its SmolLM2 variants (M = 8 of 30), for each ``--parents`` name and each
``--methods`` one (default: the training-free patch only):

1. ``depthprune heal PARENT --method METHOD --data DATA --json``, timed: the patch with ReplaceMe's defaults;
   lora, distill and last-blocks with the settings of docs/benchmarks.md's healing section
   (:data:`METHOD_ARGS`), so the training methods' seconds and quality are comparable with it;
2. then one ``depthprune eval dense PARENT CHILD ... --suite offline --json``: every model paired against
   dense on the same items and windows (retention with its interval), and each child against its parent — the
   fraction of the log-perplexity gap it recovered, with a paired bootstrap interval over windows, in-domain
   (pydoc) and out-of-domain (GCIDE prose, which no calibration source uses), and on every task the child
   paired against its parent on the same items (``against_parent``: the perplexity ratio with a paired
   bootstrap interval, the accuracy difference with its paired interval and McNemar's p).

Prints the markdown tables of docs/benchmarks.md ("SmolLM2-135M: repair methods compared") and writes the raw
JSON under ``--out`` (``--render`` prints the tables again from there). Resumable: run the same command again
after a kill and the heals already in ``--out/heals.json`` are kept with their seconds. Run on a quiet
machine (the heal seconds are a result)::

    DEPTHPRUNE_HOME=~/.depthprune heavy --quiet .venv/bin/python -m benchmarks.bench_repair --out /tmp/repair
    DEPTHPRUNE_HOME=~/.depthprune heavy --quiet .venv/bin/python -m benchmarks.bench_repair \
        --out /tmp/repair --methods patch,lora,distill,last-blocks
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def training(steps: int, lr: str) -> list[str]:
    """``heal`` options of a training method: batches of 4 x 128 tokens, held-out loss on 16 windows."""
    return [
        "--steps",
        str(steps),
        "--lr",
        lr,
        "--batch-size",
        "4",
        "--seq-len",
        "128",
        "--eval-windows",
        "16",
    ]


METHOD_ARGS = {
    "patch": [],
    "lora": training(50, "1e-3"),
    "distill": training(25, "1e-3"),
    "last-blocks": training(50, "1e-4"),
}
"""``heal`` options per method: the patch at its defaults; the training methods as in the healing section
(50 steps of 4 x 128 tokens, lr 1e-3; distill 25 steps), last-blocks at heal's default lr 1e-4 (a full
fine-tune of the LM head and the last three blocks: LoRA's lr would overshoot)."""

TASKS = (
    ("pydoc", "pydoc ppl"),
    ("gcide", "GCIDE ppl"),
    ("pydoc_cloze", "pydoc-cloze"),
    ("gcide_define", "GCIDE-define"),
)


def run_json(command: list[str], log: Path) -> tuple[object, float]:
    """Run a depthprune command; its JSON output and its wall seconds (stderr to ``log``)."""
    started = time.perf_counter()
    with open(log, "w") as errors:
        completed = subprocess.run(command, stdout=subprocess.PIPE, stderr=errors, text=True)
    seconds = time.perf_counter() - started
    if completed.returncode != 0:
        raise SystemExit(f"{' '.join(command[2:5])} failed (exit {completed.returncode}); see {log}")
    text = completed.stdout.strip()  # eval prints one indented document, heal one line
    return json.loads(text if text.startswith("[") else text.splitlines()[-1]), seconds


def interval(value, ci95, digits: int) -> str:
    if value is None:
        return "–"
    if not ci95:
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} [{ci95[0]:.{digits}f}, {ci95[1]:.{digits}f}]"


def cell(record: dict | None, baseline: bool) -> str:
    """Dense: value [95 %]; others: the value and its retention (% of dense) [paired 95 %]."""
    if not record:
        return "–"
    key = "perplexity" if "perplexity" in record else "accuracy"
    value = interval(record.get(key), record.get(f"{key}_ci95"), 2 if key == "perplexity" else 3)
    if baseline:
        return value
    return f"{value}; {interval(record.get('retention'), record.get('retention_ci95'), 1)} %"


def table(models: list[dict], heal_seconds: dict[str, float], labels: dict | None = None) -> list[str]:
    """The markdown rows: one per model, then the gap each child recovered. ``labels``: a child's registry
    name -> ``PARENT + METHOD``."""
    labels = labels or {}
    lines = ["| model | " + " | ".join(header for _, header in TASKS) + " | heal s |"]
    lines.append("|---|" + "---|" * len(TASKS) + "---:|")
    for model in models:
        cells = [cell(model["tasks"].get(task), model["baseline"]) for task, _ in TASKS]
        seconds = heal_seconds.get(model["label"])
        lines.append(
            f"| {labels.get(model['label'], model['label'])} | "
            + " | ".join(cells)
            + f" | {'–' if seconds is None else f'{seconds:.0f}'} |"
        )
    lines += ["", "| child | gap recovered, pydoc [95 %] | gap recovered, GCIDE [95 %] |", "|---|---|---|"]
    for model in models:
        gaps = [model["tasks"].get(task, {}) for task in ("pydoc", "gcide")]
        if any(gap.get("gap_recovered") is not None for gap in gaps):
            texts = [interval(gap.get("gap_recovered"), gap.get("gap_recovered_ci95"), 3) for gap in gaps]
            lines.append(f"| {labels.get(model['label'], model['label'])} | {texts[0]} | {texts[1]} |")
    return lines + against_parent(models, labels)


def parent_delta(record: dict) -> str:
    """A child's paired difference from its parent on one task: the perplexity ratio child / parent, or the
    accuracy difference with McNemar's exact p; ``(no measurable change)`` when the interval holds 1 or 0."""
    paired = record.get("against_parent") or {}
    if "perplexity_ratio" in paired:
        text = f"×{interval(paired['perplexity_ratio'], paired.get('perplexity_ratio_ci95'), 3)}"
    elif "accuracy_delta" in paired:
        delta, (low, high) = paired["accuracy_delta"], paired["accuracy_delta_ci95"]
        text = f"{delta:+.3f} [{low:+.3f}, {high:+.3f}], p {paired['mcnemar_p']:.1g}"
    else:
        return "–"
    return text + (" (no measurable change)" if paired.get("verdict") == "no measurable change" else "")


def against_parent(models: list[dict], labels: dict) -> list[str]:
    """The table of each child against its parent, paired on the same items and windows (paired bootstrap
    for perplexity, paired bootstrap and McNemar for accuracy): which repair claims hold."""
    rows = [
        f"| {labels.get(model['label'], model['label'])} | "
        + " | ".join(parent_delta(model["tasks"].get(task, {})) for task, _ in TASKS)
        + " |"
        for model in models
        if any((model["tasks"].get(task) or {}).get("against_parent") for task, _ in TASKS)
    ]
    if not rows:
        return []
    header = "| child against its parent | " + " | ".join(name for _, name in TASKS) + " |"
    return ["", header, "|---|" + "---|" * len(TASKS), *rows]


def run_tables(models: list[dict], heals: list[dict]) -> list[str]:
    """:func:`table` of a run: each child labelled ``PARENT + METHOD`` with its heal seconds (``heals``: one
    ``{"parent", "method", "name", "seconds"}`` per heal, as ``heals.json`` keeps them)."""
    seconds = {heal["name"]: heal["seconds"] for heal in heals}
    labels = {heal["name"]: f"{heal['parent']} + {heal['method']}" for heal in heals}
    return table(models, seconds, labels)


def rendered(out: Path) -> list[str]:
    """The tables of an earlier run from its ``eval.json`` and ``heals.json`` under ``out`` (runs nothing)."""
    heals = out / "heals.json"
    return run_tables(
        json.loads((out / "eval.json").read_text()), json.loads(heals.read_text()) if heals.is_file() else []
    )


def recorded_heals(out: Path) -> list[dict]:
    """The heals an earlier run into ``out`` finished (``heals.json``): a run killed between heals resumes
    after the last one, each heal keeping the seconds it was measured in (a heal run again would find its
    child in the registry and time nothing)."""
    path = out / "heals.json"
    return json.loads(path.read_text()) if path.is_file() else []


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the JSON and logs")
    parser.add_argument("--parents", default="ppl-best,ce-best", help="variants to patch, comma-separated")
    parser.add_argument("--data", default="pydoc", help="text the repair is estimated or trained on")
    parser.add_argument(
        "--methods", default="patch", help=f"comma-separated heal methods: {', '.join(METHOD_ARGS)}"
    )
    parser.add_argument(
        "--engine", default="hf", help="eval engine (hf: the torch engine of the offline-suite figures)"
    )
    parser.add_argument(
        "--children", help="children patched before, one per parent in order (no heal run, no heal seconds)"
    )
    parser.add_argument(
        "--render", action="store_true", help="print the tables of the run already in --out; run nothing"
    )
    args = parser.parse_args(argv)
    methods = args.methods.split(",")
    unknown = [method for method in methods if method not in METHOD_ARGS]
    if unknown:
        parser.error(f"unknown method {unknown[0]!r}; choose from {', '.join(METHOD_ARGS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.render:
        print("\n".join(rendered(args.out)))
        return
    depthprune = [sys.executable, "-m", "depthprune"]
    names, heals = ["dense"], []
    if args.children:
        for parent, child in zip(args.parents.split(","), args.children.split(","), strict=True):
            names += [parent, child]
    done = {(heal["parent"], heal["method"]): heal for heal in recorded_heals(args.out)}
    for parent in [] if args.children else args.parents.split(","):
        names.append(parent)  # the parent before its children: eval pairs each child with it
        for method in methods:
            if (parent, method) in done:  # healed by an earlier run into this --out: its own seconds kept
                heals.append(done[parent, method])
                names.append(done[parent, method]["name"])
                print(f"heal {parent} ({method}): kept from {args.out / 'heals.json'}", file=sys.stderr)
                continue
            command = [*depthprune, "heal", parent, "--method", method, "--data", args.data, "--json"]
            healed, seconds = run_json(
                command + METHOD_ARGS[method], args.out / f"heal-{parent}-{method}.log"
            )
            (args.out / f"heal-{parent}-{method}.json").write_text(json.dumps(healed, indent=1))
            heals.append({"parent": parent, "method": method, "name": healed["name"], "seconds": seconds})
            (args.out / "heals.json").write_text(json.dumps(heals, indent=1))
            names.append(healed["name"])
            print(
                f"heal {parent} ({method}): {healed['name']} in {seconds:.0f} s", file=sys.stderr, flush=True
            )
    command = [*depthprune, "eval", *names, "--suite", "offline", "--engine", args.engine, "--json"]
    models, seconds = run_json(command, args.out / "eval.log")
    (args.out / "eval.json").write_text(json.dumps(models, indent=1))
    print(f"eval of {len(names)} models on the offline suite: {seconds:.0f} s", file=sys.stderr)
    print("\n".join(run_tables(models, heals)))


if __name__ == "__main__":
    main()
