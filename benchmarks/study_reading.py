"""The numbers a study's reading quotes that its report does not tabulate, from the report's ``study.json``.

    .venv/bin/python benchmarks/study_reading.py docs/study-smollm2-135m [.../cross-controls]

Prints Markdown: per calibration configuration and M, the quality of the searches' variants (mean, best and
worst over the paper's seven, seeds pooled) and of the variant with the lowest calibration loss (what a user
would deploy); the random-prior control against the prior-guided run of the same search and seed; how often a
search changed its mask between seeds; and, for a report with several configurations of one objective (the
cross-controls), the Jaccard similarity of the same search's masks between every two configurations.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from collections import defaultdict
from pathlib import Path

STUDY_SEARCHES = ("one_shot", "greedy", "beam", "genetic", "bayesian", "cbo", "fast_block_select")


def jaccard(first, second) -> float:
    first, second = set(first), set(second)
    return len(first & second) / len(first | second)


def configuration(cell: dict) -> str:
    """``objective on data``, a local file or directory shown by its name only."""
    data = cell["data"].split("@")[0]
    prefix, _, path = data.partition(":")
    if prefix in ("text", "mc", "commonsense170k") and path:
        data = f"{prefix}:{Path(path).name}"
    return f"{cell['objective']} on {data}"


def quality(metrics: dict, perplexity: list[str], accuracy: dict[str, str]) -> tuple[float, float]:
    """(Avg perplexity, mean primary accuracy in points) of a variant's metrics, as the report reads them."""
    average = statistics.fmean(metrics[f"{task}/perplexity"] for task in perplexity)
    return average, statistics.fmean(100 * metrics[f"{task}/{metric}"] for task, metric in accuracy.items())


def metric_names(study: dict) -> tuple[list[str], dict[str, str]]:
    """The report's perplexity tasks (its Avg) and task -> accuracy metric (older reports: one of each)."""
    if "average_perplexity_tasks" in study:
        return study["average_perplexity_tasks"], study["accuracy_metrics"]
    return [study["primary_perplexity"]], {task: "acc" for task in study["accuracy_tasks"]}


def quality_table(
    cells: list[dict], perplexity: list[str], accuracy: dict[str, str], dense: dict
) -> list[str]:
    dense_ppl, dense_acc = quality(dense, perplexity, accuracy)
    lines = [
        f"Dense: Avg ppl ({', '.join(perplexity)}) {dense_ppl:.2f}, accuracy "
        f"({', '.join(f'{task} {metric}' for task, metric in accuracy.items())}) {dense_acc:.1f} points.",
        "",
        "| configuration | M | variants | ppl mean | ppl best | ppl worst | acc mean | acc best | acc worst "
        "| lowest-loss search | its ppl | its acc |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups = defaultdict(list)
    for cell in cells:
        if cell["prior"] == "single_block" and cell["search"] in STUDY_SEARCHES:
            groups[(configuration(cell), cell["drop"])].append(cell)
    for (name, drop), group in sorted(groups.items()):
        measured = [quality(cell["metrics"], perplexity, accuracy) for cell in group]
        ppls, accs = [m[0] for m in measured], [m[1] for m in measured]
        best = min(group, key=lambda cell: cell["calibration_loss"])
        best_ppl, best_acc = quality(best["metrics"], perplexity, accuracy)
        lines.append(
            f"| {name} | {drop} | {len(group)} | {statistics.fmean(ppls):,.1f} | {min(ppls):,.1f} | "
            f"{max(ppls):,.1f} | {statistics.fmean(accs):.1f} | {max(accs):.1f} | {min(accs):.1f} | "
            f"{best['search']} (seed {best['seed']}) | {best_ppl:,.1f} | {best_acc:.1f} |"
        )
    return lines


def prior_table(cells: list[dict], perplexity: list[str], accuracy: dict[str, str]) -> list[str]:
    by_key = {(configuration(c), c["drop"], c["search"], c["seed"], c["prior"]): c for c in cells}
    rows = defaultdict(list)
    for (name, drop, search, seed, prior), cell in by_key.items():
        guided = by_key.get((name, drop, search, seed, "single_block"))
        if prior != "random" or guided is None:
            continue
        rows[(name, drop, search)].append((guided, cell))
    if not rows:
        return []
    lines = [
        "| configuration | M | search | seeds | Δ loss (random − prior) | ppl prior → random | "
        "acc prior → random | same mask |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (name, drop, search), pairs in sorted(rows.items()):
        delta = statistics.fmean(r["calibration_loss"] - g["calibration_loss"] for g, r in pairs)
        guided = [quality(g["metrics"], perplexity, accuracy) for g, _ in pairs]
        randomised = [quality(r["metrics"], perplexity, accuracy) for _, r in pairs]
        same = sum(sorted(g["removed_blocks"]) == sorted(r["removed_blocks"]) for g, r in pairs)
        ppl = (statistics.fmean(q[0] for q in guided), statistics.fmean(q[0] for q in randomised))
        acc = (statistics.fmean(q[1] for q in guided), statistics.fmean(q[1] for q in randomised))
        lines.append(
            f"| {name} | {drop} | {search} | {len(pairs)} | {delta:+.4f} | "
            f"{ppl[0]:,.1f} → {ppl[1]:,.1f} | {acc[0]:.1f} → {acc[1]:.1f} | "
            f"{same}/{len(pairs)} |"
        )
    return lines


def seed_stability(cells: list[dict]) -> list[str]:
    masks = defaultdict(set)
    for cell in cells:
        masks[(configuration(cell), cell["drop"], cell["search"], cell["prior"])].add(
            tuple(sorted(cell["removed_blocks"]))
        )
    changed = sorted(
        f"{search} ({prior} prior, {name}, M = {drop}): {len(found)} masks"
        for (name, drop, search, prior), found in masks.items()
        if len(found) > 1
    )
    return [f"Searches whose mask changed between seeds ({len(changed)} of {len(masks)}):", ""] + [
        f"- {line}" for line in changed
    ]


def cross_table(cells: list[dict]) -> list[str]:
    guided = [c for c in cells if c["prior"] == "single_block" and c["seed"] == min(x["seed"] for x in cells)]
    names = sorted({configuration(c) for c in guided})
    if len(names) < 3:
        return []
    by_key = {(configuration(c), c["drop"], c["search"]): c for c in guided}
    lines = [
        "| configuration A | configuration B | M | searches | mean J(same search) | J per search |",
        "|---|---|---|---|---|---|",
    ]
    for first, second in itertools.combinations(names, 2):
        for drop in sorted({c["drop"] for c in guided}):
            pairs = [
                (
                    search,
                    jaccard(
                        by_key[(first, drop, search)]["removed_blocks"],
                        by_key[(second, drop, search)]["removed_blocks"],
                    ),
                )
                for search in sorted({c["search"] for c in guided})
                if (first, drop, search) in by_key and (second, drop, search) in by_key
            ]
            if pairs:
                lines.append(
                    f"| {first} | {second} | {drop} | {len(pairs)} | "
                    f"{statistics.fmean(j for _, j in pairs):.3f} | "
                    + ", ".join(f"{search} {j:.2f}" for search, j in pairs)
                    + " |"
                )
    return lines


def report(directory: Path) -> list[str]:
    study = json.loads((directory / "study.json").read_text())
    cells, (perplexity, accuracy) = study["cells"], metric_names(study)
    lines = [f"# {directory}", "", "## Quality of the paper's seven searches' variants", ""]
    lines += quality_table(cells, perplexity, accuracy, study["dense"])
    for title, table in (
        ("Random-prior control", prior_table(cells, perplexity, accuracy)),
        ("Seed stability", seed_stability(cells)),
        ("Same search, different configurations (Jaccard)", cross_table(cells)),
    ):
        if table:
            lines += ["", f"## {title}", ""] + table
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path, help="study report directories (with study.json)")
    for directory in parser.parse_args().reports:
        print("\n".join(report(directory)) + "\n")


if __name__ == "__main__":
    main()
