"""Issue #26's experiment: which calibration objective gives a usable variant (docs/objectives.md).

SmolLM2-135M, M = 8: perplexity (``pydoc``) against ``task_margin``, ``task_margin --margin-clip``,
``task_ce`` and ``task_margin --kl-weight`` (``pydoc-phrase``, multi-word answers), at several calibration
sizes (untruncated: an item longer than ``--seq-len`` stops the run) and searches. Each cell (configuration,
size) builds one evaluator shared by its searches; every outcome and ``--random-sets`` random removal sets
are scored on held-out data the calibration never saw: perplexity on ``pydoc``'s ``test`` split and accuracy
on the ``test`` items of ``pydoc-cloze`` (the 341 items) and ``pydoc-phrase``. Writes ``results.json`` and a
Markdown table with the criteria C1-C4 to ``--out``.

Run under the heavy-job slot (not a timing measurement)::

    /work/bin/heavy .venv/bin/python -m benchmarks.bench_objectives --out docs/objectives-results \\
        --samples 4,16,64 --searches one_shot --greedy-samples 4,16,64

It resumes: finished cells stay in ``results.json``, every scored removal set in ``heldout.json``
(:class:`HeldOutCache`) and each cell's subset scores in ``memos/`` (journalled as they are computed), so
a killed run goes on where it stopped; a finished cell asked for a search it lacks (``--genetic-samples``)
runs again with all its searches. Cells run in parallel into other directories (other configurations,
other machines) join with ``--merge-from DIR ...``. Cost on the 2-core machine: held-out scoring of one set
is about 2-3 min of one core (choices packed); greedy at 64 items is 212 subset evaluations of 64 items
(13-30 min of one core for a task configuration, 67 min for perplexity's 64 x 256-token windows).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

from scipy.stats import spearmanr

from ground.planning.devices import resolve_device, resolve_dtype
from pruning.calibration.config import CalibrationConfig
from pruning.calibration.data.items import ChoiceSamples
from pruning.calibration.data.sampling import sample_stream_windows
from pruning.calibration.data.specs import load_choice_items, load_documents
from pruning.calibration.scoring.build import build_evaluator
from pruning.model.sources import resolve_model
from pruning.pipeline.heldout import choice_accuracy, naive_scorer
from pruning.pipeline.prune import run_searches

CONFIGURATIONS = {
    "perplexity": ("perplexity", "pydoc", {"sampling": "stream"}),  # 64 x 256-token windows exist
    "task_margin": ("task_margin", "pydoc-phrase", {}),
    "margin_clip1": ("task_margin", "pydoc-phrase", {"margin_clip": 1.0}),
    "task_ce": ("task_ce", "pydoc-phrase", {}),
    "margin_kl1": ("task_margin", "pydoc-phrase", {"kl_weight": 1.0}),
}
"""Name -> (objective, calibration data, parameters)."""


def test_scorers(evaluator, tokenizer, windows: int, window_tokens: int, test_items: int | None) -> dict:
    """Naive scorers on the held-out test data, sharing the evaluator's model."""
    text = sample_stream_windows(
        load_documents("pydoc", "test"), tokenizer, windows, window_tokens, 0, "pydoc"
    )
    scorers = {
        "pydoc": naive_scorer(
            evaluator, CalibrationConfig("perplexity", "pydoc", windows, window_tokens), text, tokenizer
        )
    }
    for spec in ("pydoc-cloze", "pydoc-phrase"):
        config = CalibrationConfig("task_ce", spec, samples=1, seq_len=evaluator.config.seq_len)
        items = ChoiceSamples(load_choice_items(spec, "test")[:test_items], spec)
        scorers[spec] = naive_scorer(evaluator, config, items, tokenizer)
    return scorers


class HeldOutCache:
    """Held-out scores per removal set, kept in ``heldout.json`` beside the results.

    Held-out scoring is a large part of a cell's cost: every set is a plain forward over 341 cloze items,
    279 phrase items (about 4 choices of ~45 tokens each; packed, each item's prompt runs once) and the
    perplexity windows (about 2-3 min of one core here, extrapolated from the 48-item figures of
    ``benchmarks.bench_heldout_packing``; 10-18 min unpacked). The same set recurs across cells (the random
    sets are drawn with seed 0 for every cell; dense in every cell; objectives often agree), and the test data
    and model are the same in every cell, so each distinct set is scored once, and a rerun after a kill
    resumes.
    """

    def __init__(self, path: Path, settings: dict):
        self.path, self.settings = path, settings
        stored = json.loads(path.read_text()) if path.is_file() else {}
        self.scores = stored.get("scores", {}) if stored.get("settings") == settings else {}

    def __call__(self, scorers: dict, removed) -> dict:
        key = ",".join(map(str, sorted(removed)))
        if key not in self.scores:
            removed = frozenset(removed)
            self.scores[key] = {
                "perplexity": math.exp(min(scorers["pydoc"].score(removed), 700.0)),
                "cloze_accuracy": choice_accuracy(scorers["pydoc-cloze"], removed)[0],
                "phrase_accuracy": choice_accuracy(scorers["pydoc-phrase"], removed)[0],
            }
            self.path.write_text(json.dumps({"settings": self.settings, "scores": self.scores}, indent=1))
            print(f"  held-out [{key}]: {self.scores[key]}", flush=True)
        return self.scores[key]


def run_cell(
    model: str, name: str, samples: int, searches: tuple[str, ...], args, held_out: HeldOutCache
) -> dict:
    objective, data, parameters = CONFIGURATIONS[name]
    config = CalibrationConfig(objective, data, samples=samples, seq_len=args.seq_len, seed=0, **parameters)
    started = time.perf_counter()
    evaluator = build_evaluator(model, config, progress=True, device=args.device, dtype=args.dtype)
    scorers = test_scorers(
        evaluator, evaluator.tokenizer, args.windows, min(args.seq_len, 256), args.test_items
    )
    # Every subset score is journalled as it is computed (a greedy at 64 items is hours of one core): a
    # killed cell resumes with what it had scored. A finished cell keeps its scores in memos/*.json, so
    # running it again with another search recomputes nothing it had.
    memo = args.out / "memos" / f"{name}-{samples}.json"
    if memo.is_file():
        evaluator.load_memo(memo)
    journal = evaluator.journal_memo(memo.with_suffix(".journal"))
    runs = run_searches(evaluator, args.drop, searches, seed=0, options={}, progress=True)
    rng = random.Random(0)
    sets = [
        ("random", sorted(rng.sample(range(evaluator.num_blocks), args.drop)))
        for _ in range(args.random_sets)
    ]
    rows = []
    for label, removed in [(run.search, run.result.removed_blocks) for run in runs] + sets:
        rows.append(
            {
                "set": label,
                "removed": list(removed),
                "calibration_loss": evaluator.score(frozenset(removed)),
                **held_out(scorers, removed),
            }
        )
    losses = [row["calibration_loss"] for row in rows]
    cell = {
        "configuration": name,
        "samples": samples,
        "dense_calibration_loss": evaluator.dense_loss(),
        "dense": held_out(scorers, ()),
        "rows": rows,
        "rho_loss_perplexity": spearmanr(losses, [row["perplexity"] for row in rows]).statistic,
        "rho_negloss_accuracy": spearmanr(
            [-loss for loss in losses], [row["phrase_accuracy"] for row in rows]
        ).statistic,
        "seconds": time.perf_counter() - started,
        "device": args.device,
        "dtype": args.dtype,
    }
    evaluator.save_memo(memo)
    journal.close(delete=True)
    return cell


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--drop", type=int, default=8)
    parser.add_argument("--samples", default="4,16,64")
    parser.add_argument("--searches", default="one_shot")
    parser.add_argument("--greedy-samples", default="4", help="Sizes at which greedy also runs ('' = none).")
    parser.add_argument(
        "--genetic-samples", default="", help="Sizes at which genetic (16 x 10) also runs ('' = none)."
    )
    parser.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N.")
    # float32 by default on every device, unlike the CLI's auto (bfloat16 on CUDA): cells computed on a GPU
    # and on the CPU then agree to float32 rounding and can share one results.json.
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--configurations", default=",".join(CONFIGURATIONS))
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--random-sets", type=int, default=6)
    parser.add_argument("--test-items", type=int, default=None, help="First N test items of each task only.")
    parser.add_argument(
        "--report-only", action="store_true", help="Rewrite table.md from results.json; run nothing."
    )
    parser.add_argument(
        "--merge-from",
        type=Path,
        nargs="+",
        default=(),
        help="Add the cells and held-out scores of other --out directories (runs of other cells in parallel, "
        "on other machines) to --out, then rewrite table.md; run nothing.",
    )
    args = parser.parse_args()
    if args.merge_from:
        merge_results(args.out, args.merge_from)
    if args.report_only or args.merge_from:
        (args.out / "table.md").write_text(report(json.loads((args.out / "results.json").read_text())))
        return
    args.device = resolve_device(args.device)
    args.dtype = resolve_dtype(args.dtype, args.device)
    model = resolve_model(args.model).model
    args.out.mkdir(parents=True, exist_ok=True)
    greedy_at = {int(size) for size in args.greedy_samples.split(",") if size}
    genetic_at = {int(size) for size in args.genetic_samples.split(",") if size}
    results = args.out / "results.json"
    cells = json.loads(results.read_text()) if results.is_file() else []  # resumes, adds cells
    held_out = HeldOutCache(
        args.out / "heldout.json",
        {key: getattr(args, key) for key in ("model", "windows", "seq_len", "test_items", "dtype")},
    )
    for name in args.configurations.split(","):
        for samples in (int(size) for size in args.samples.split(",")):
            earlier = next(
                (cell for cell in cells if (cell["configuration"], cell["samples"]) == (name, samples)), None
            )
            ran = [row["set"] for row in _outcomes(earlier)] if earlier else []
            wanted = (
                tuple(args.searches.split(","))
                + (("greedy",) if samples in greedy_at else ())
                + (("genetic",) if samples in genetic_at else ())
            )
            if set(wanted) <= set(ran):
                continue
            # A cell asked for a search it lacks runs again with every search it had (the held-out scores
            # of the sets it already found are cached), so its ρ covers all of them.
            searches = tuple(dict.fromkeys([*ran, *wanted]))
            print(f"{name} x {samples}: {', '.join(searches)} ...", flush=True)
            cell = run_cell(model, name, samples, searches, args, held_out)
            cells = [other for other in cells if other is not earlier] + [cell]
            (args.out / "results.json").write_text(json.dumps(cells, indent=1))
            (args.out / "table.md").write_text(report(cells))
            print(f"{name} x {samples}: {cell['seconds']:.0f} s", flush=True)
    (args.out / "table.md").write_text(report(cells))


def merge_results(out: Path, sources: list[Path]) -> None:
    """Add the cells (by configuration and size) and held-out scores of ``sources`` to ``out``'s files.

    A cell both have is kept as ``out`` has it; held-out scores must come from the same settings (model,
    windows, window length, test items, dtype), else the merge stops before writing anything."""
    cells = json.loads((out / "results.json").read_text())
    held_out = json.loads((out / "heldout.json").read_text())
    have = {(cell["configuration"], cell["samples"]) for cell in cells}
    for source in sources:
        other = json.loads((source / "heldout.json").read_text())
        if other["settings"] != held_out["settings"]:
            raise SystemExit(f"{source}: held-out settings {other['settings']} differ from {out}'s")
        held_out["scores"] = {**other["scores"], **held_out["scores"]}
        for cell in json.loads((source / "results.json").read_text()):
            if (cell["configuration"], cell["samples"]) not in have:
                cells.append(cell)
                have.add((cell["configuration"], cell["samples"]))
    (out / "heldout.json").write_text(json.dumps(held_out, indent=1))
    (out / "results.json").write_text(json.dumps(cells, indent=1))


def _outcomes(cell: dict) -> list[dict]:
    return [row for row in cell["rows"] if row["set"] != "random"]


def _geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(value) for value in values) / len(values))


def _c4(cell: dict, row: dict) -> bool:
    """C4 for one outcome: not "beats dense on calibration while failing held-out" (ppl > K x dense)."""
    beats_dense = row["calibration_loss"] < cell["dense_calibration_loss"]
    return not (beats_dense and row["perplexity"] > 10 * cell["dense"]["perplexity"])


def _cell_summary(cell: dict, baseline: dict | None) -> dict:
    """A cell's geometric-mean held-out perplexity and mean phrase accuracy over its searches, and C1-C4
    against the perplexity cell of the same size (``baseline``; C1 and C2 are None without one)."""
    outcomes = _outcomes(cell)
    summary = {
        "ppl": _geomean(row["perplexity"] for row in outcomes),
        "acc": sum(row["phrase_accuracy"] for row in outcomes) / len(outcomes),
        "c3": cell["rho_loss_perplexity"] >= 0 and cell["rho_negloss_accuracy"] >= 0,
        "c4": all(_c4(cell, row) for row in outcomes),
    }
    if baseline is None:
        return {**summary, "ratio": None, "c1": None, "c2": None}
    # like with like: the perplexity cell over the searches this cell ran (genetic ran for some cells only)
    searches = {row["set"] for row in outcomes}
    base = _cell_summary(
        {**baseline, "rows": [row for row in baseline["rows"] if row["set"] in searches | {"random"}]}, None
    )
    ratio = summary["ppl"] / base["ppl"]
    return {**summary, "ratio": ratio, "c1": summary["acc"] >= base["acc"] - 0.05, "c2": ratio <= 3}


def _verdict(value: bool | None) -> str:
    return "–" if value is None else ("met" if value else "**missed**")


def report(cells: list[dict]) -> str:
    """Markdown: every outcome, then per cell the criteria C1-C4 (docs/objectives.md states them)."""
    cells = sorted(
        cells, key=lambda cell: (list(CONFIGURATIONS).index(cell["configuration"]), cell["samples"])
    )
    baseline = {cell["samples"]: cell for cell in cells if cell["configuration"] == "perplexity"}
    lines = [
        "| configuration | items | search | removed | cal. loss (dense) | held-out ppl | cloze acc "
        "| phrase acc | C4 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in cells:
        for row in _outcomes(cell):
            lines.append(
                f"| {cell['configuration']} | {cell['samples']} | {row['set']} | "
                f"{' '.join(map(str, row['removed']))} | {row['calibration_loss']:.4g} "
                f"({cell['dense_calibration_loss']:.4g}) | {row['perplexity']:,.1f} | "
                f"{row['cloze_accuracy']:.3f} | {row['phrase_accuracy']:.3f} | {_verdict(_c4(cell, row))} |"
            )
    lines += [
        "",
        "Per cell: geometric mean of held-out perplexity and mean phrase accuracy over the cell's searches, "
        "against the perplexity cell of the same size over the same searches; ρ over the cell's outcomes "
        "and random sets.",
        "",
        "| configuration | items | searches | geo-mean ppl | ÷ perplexity's (C2 ≤ 3) | mean phrase acc "
        "| ρ(loss, ppl) | ρ(−loss, phrase acc) | C1 | C2 | C3 | C4 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cell in cells:
        base = baseline.get(cell["samples"]) if cell["configuration"] != "perplexity" else None
        summary = _cell_summary(cell, base)
        ratio = (
            "1 (baseline)"
            if cell["configuration"] == "perplexity"
            else ("– (no perplexity cell)" if summary["ratio"] is None else f"{summary['ratio']:,.2f}")
        )
        lines.append(
            f"| {cell['configuration']} | {cell['samples']} | "
            f"{', '.join(row['set'] for row in _outcomes(cell))} | {summary['ppl']:,.1f} | {ratio} | "
            f"{summary['acc']:.3f} | {cell['rho_loss_perplexity']:.2f} | "
            f"{cell['rho_negloss_accuracy']:.2f} | "
            f"{_verdict(summary['c1'])} | {_verdict(summary['c2'])} | {_verdict(summary['c3'])} | "
            f"{_verdict(summary['c4'])} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
