"""Evaluation scoring, packed (shared prefix, LM head at scored positions) against naive (docs/benchmarks.md).

Builds the ``offline`` suite's requests the way lm-eval does (:class:`~pruning.evaluation.lm_eval_models.
PairEncoder`: the ``pydoc_cloze`` and ``gcide_define`` items with their task prompts, one request per choice;
the ``pydoc`` and ``gcide`` perplexity windows of ``--seq-len`` tokens) and scores each workload with the same
loaded :class:`~pruning.evaluation.engines.TorchEngine` both ways, ``--repeats`` interleaved rounds (naive,
packed, naive, packed, ...), printing the median seconds, the speed-up, the accuracies (or perplexities) of
both paths and the largest difference of any request's log-probability. ``--items`` and ``--windows`` take the
first N of each task (the naive path takes minutes on 2 cores). Run on a quiet machine::

    heavy --quiet .venv/bin/python -m benchmarks.bench_eval_scoring --items 40 --windows 1 --repeats 1
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from pruning.calibration.data.pydoc import cloze_items
from pruning.calibration.data.sampling import text_windows
from pruning.calibration.data.specs import load_documents
from pruning.evaluation.engines import ScoreRequest, TorchEngine
from pruning.evaluation.gcide import define_items, prose_documents
from pruning.evaluation.lm_eval_models import PairEncoder
from pruning.model.sources import resolve_model


def choice_workload(encoder: PairEncoder, items, prompt: str) -> tuple[list[ScoreRequest], list]:
    """One request per (item, choice): lm-eval's ``doc_to_text`` prompt, the choice after a space."""
    requests = [
        encoder.encode_pair(prompt.format(context=item.context), f" {choice}")
        for item in items
        for choice in item.choices
    ]
    return requests, items


def window_workload(documents: list[str], tokenizer, seq_len: int, limit) -> tuple[list[ScoreRequest], None]:
    """The perplexity suite's requests: every window (the first ``limit``), its first token as the context."""
    windows = text_windows(documents, tokenizer, seq_len)[:limit]
    return [ScoreRequest((window[0],), tuple(window[1:])) for window in windows], None


def summary(results, items) -> str:
    """Accuracy of choice workloads (highest summed log-probability), perplexity of window workloads."""
    if items is None:
        return f"ppl {math.exp(-sum(r.logprob for r in results) / sum(r.tokens for r in results)):.3f}"
    correct, start = 0, 0
    for item in items:
        scores = [result.logprob for result in results[start : start + len(item.choices)]]
        correct += scores.index(max(scores)) == item.label
        start += len(item.choices)
    return f"acc {correct / len(items):.3f}"


def compare(engine: TorchEngine, requests: list[ScoreRequest], items, repeats: int) -> dict:
    """Median seconds of both paths over interleaved rounds, their summaries and the largest difference."""
    seconds: dict[bool, list[float]] = {True: [], False: []}
    outputs = {}
    for _ in range(repeats):
        for naive in (True, False):
            engine.naive = naive
            started = time.perf_counter()
            outputs[naive] = engine.score(requests)
            seconds[naive].append(time.perf_counter() - started)
    engine.naive = False
    difference = max(abs(a.logprob - b.logprob) for a, b in zip(outputs[True], outputs[False], strict=True))
    return {
        "naive_s": statistics.median(seconds[True]),
        "packed_s": statistics.median(seconds[False]),
        "naive": summary(outputs[True], items),
        "packed": summary(outputs[False], items),
        "max_difference": difference,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=3, help="Interleaved rounds of both paths.")
    parser.add_argument("--seq-len", type=int, default=2048, help="Perplexity window length.")
    parser.add_argument("--items", type=int, default=None, help="First N items of each choice task.")
    parser.add_argument("--windows", type=int, default=None, help="First N windows of each text.")
    args = parser.parse_args()
    engine = TorchEngine(resolve_model(args.model).model, device="cpu")
    encoder = PairEncoder(engine.tokenizer)
    workloads = {
        "pydoc_cloze": choice_workload(encoder, cloze_items("test")[: args.items], "{context}"),
        "gcide_define": choice_workload(
            encoder, define_items()[: args.items], "Definition: {context}\nWord:"
        ),
        "pydoc perplexity": window_workload(
            load_documents("pydoc", "test"), engine.tokenizer, args.seq_len, args.windows
        ),
        "gcide perplexity": window_workload(prose_documents(), engine.tokenizer, args.seq_len, args.windows),
    }
    print(f"torch threads: {torch.get_num_threads()}; median of {args.repeats} interleaved rounds")
    print("| workload | requests | naive s | packed s | speed-up | naive | packed | max abs diff logprob |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (requests, items) in workloads.items():
        row = compare(engine, requests, items, args.repeats)
        print(
            f"| {name} | {len(requests)} | {row['naive_s']:.1f} | {row['packed_s']:.1f} | "
            f"{row['naive_s'] / row['packed_s']:.2f}x | {row['naive']} | {row['packed']} | "
            f"{row['max_difference']:.1e} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
