"""Held-out accuracy with each item's choices packed against one row per choice (docs/benchmarks.md).

Scores the first ``--items`` ``test`` items of ``pydoc-cloze`` and ``pydoc-phrase`` on SmolLM2-135M, dense
and with blocks removed, both ways (:func:`pruning.pipeline.heldout.choice_scores`: packed is the default; one
row per choice is what held-out scoring did before), and prints the seconds, the accuracies and the largest
difference of any choice's score. Run under the heavy-job slot (torch's threads: ``OMP_NUM_THREADS``)::

    /work/bin/heavy .venv/bin/python -m benchmarks.bench_heldout_packing --items 48
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

import torch

import pruning.pipeline.heldout as heldout
from pruning.calibration.config import CalibrationConfig
from pruning.calibration.data.items import ChoiceSamples
from pruning.calibration.data.specs import load_choice_items
from pruning.calibration.scoring.build import build_evaluator
from pruning.calibration.scoring.packing import as_run_batch
from pruning.model.sources import resolve_model

REMOVED_SETS = (frozenset(), frozenset({3, 4, 5, 12, 14, 16, 17, 25}))
"""Dense, and the perplexity one-shot set of docs/objectives.md (4 items)."""


def one_row_per_choice(scorer) -> list:
    return [as_run_batch(batch.to("cpu")) for batch in scorer.batches]


def timed(scorer, removed) -> tuple[float, torch.Tensor, float]:
    started = time.perf_counter()
    scored = heldout.choice_scores(scorer, removed)
    seconds = time.perf_counter() - started
    return seconds, torch.cat([scores for _, scores in scored]), heldout.accuracy_of(scored)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--items", type=int, default=48, help="First N test items of each task.")
    args = parser.parse_args()
    model = resolve_model(args.model).model
    config = CalibrationConfig("task_ce", "pydoc-phrase", samples=4, seq_len=256, seed=0)
    evaluator = build_evaluator(model, config, progress=False, device="cpu", dtype="float32")
    print(f"torch threads: {torch.get_num_threads()}")
    print("| task | removed | packed s | one row per choice s | speed-up | accuracy (both) | max |Δ score| |")
    print("|---|---|---|---|---|---|---|")
    for spec in ("pydoc-cloze", "pydoc-phrase"):
        items = ChoiceSamples(load_choice_items(spec, "test")[: args.items], spec)
        task = CalibrationConfig("task_ce", spec, samples=1, seq_len=256)
        scorer = heldout.naive_scorer(evaluator, task, items, evaluator.tokenizer)
        for removed in REMOVED_SETS:
            packed_s, packed, packed_acc = timed(scorer, removed)
            with mock.patch.object(heldout, "choice_runs", one_row_per_choice):
                plain_s, plain, plain_acc = timed(scorer, removed)
            accuracy = (
                f"{packed_acc:.3f}" if packed_acc == plain_acc else f"{packed_acc:.3f} vs {plain_acc:.3f}"
            )
            blocks = " ".join(map(str, sorted(removed))) or "none"
            print(
                f"| {spec} | {blocks} | {packed_s:.1f} | {plain_s:.1f} | {plain_s / packed_s:.2f}x | "
                f"{accuracy} | {float((packed - plain).abs().max()):.1e} |"
            )


if __name__ == "__main__":
    main()
