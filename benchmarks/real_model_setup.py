"""What the real-model benchmark (``benchmarks.bench_real_model``) runs and reads back: settings and records.

:class:`Results` reads the ``RESULTS/<stage>.json`` records the stages write; the settings name the model, the
budget, the searches, the calibration and every command's flags.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent

MODEL = "smollm2-135m"

DROP = 8
"""M: 8 of SmolLM2-135M's 30 blocks (27 %; the ideal speed-up N/(N−M) is 30/22 = 1.36)."""

SEARCHES = "one_shot,block_influence,lorp,streamline,fast_block_select,genetic"
"""The one-pass and cheap searches; greedy (212 subsets) and beam do not fit in ten minutes here."""

GENETIC_OPTIONS = ("-o", "genetic.population=8", "-o", "genetic.generations=5")

CALIBRATION = {
    "perplexity": ("pydoc", 8, 256),
    "task_margin": ("pydoc-cloze", 32, 256),
}
"""objective -> (data spec, samples, tokens per window / longest question) of the searches."""

QUALITY_SEARCHES = ("one_shot", "lorp", "best")
"""The variants of each objective whose held-out quality is measured: a fast search, LoRP, and ``best``
(the lowest calibration loss any search found: what a user would deploy)."""

EVAL_FLAGS = ("--suite", "offline", "--engine", "torch", "--json")

HEAL_STEPS = {"lora": 50, "distill": 25}
"""Optimizer steps per method, sized to about 12 minutes each on the shared machine: a probe at load 6
(6 steps of 4 × 256-token windows) took 26 s per LoRA step and 51 s per distillation step (the teacher's
forward and its top-k logits on top); the windows here are half as long."""

HEAL_METHODS = tuple(HEAL_STEPS)

HEAL_SEARCH = "best"
"""Each objective's variant that is healed: the one with the lowest calibration loss."""

HEAL_FLAGS = (
    "--data",
    "pydoc",
    "--batch-size",
    "4",
    "--seq-len",
    "128",
    "--lr",
    "1e-3",
    "--eval-windows",
    "16",
)
"""Small batches of short windows: more updates in the same time, which is what a short budget needs."""

EVALUATOR_FLAGS = ("--seq-len", "256", "--budget", str(DROP), "--random-sets", "20", "--batch-size", "8")

EVALUATOR_DATA = {"perplexity": ("pydoc", 4), "task_margin": ("pydoc-cloze", 8)}
"""objective -> (data spec, samples) of the evaluator benchmark: 30 single-block and 20 random M = 8 sets,
scored both ways, each objective within ten minutes of the shared machine (the searches' records give
0.4 s per 8 × 256-token block-forward and about 4.6 s per 32-question single-block subset under load)."""

LOADTEST_MODULE = "benchmarks.bench_loadtest"

LOADTEST_FLAGS = (
    "--eager",
    "--max-model-len",
    "512",
    "--dtype",
    "float32",
    "--num-prompts",
    "64",
    "--input-len",
    "128",
    "--output-len",
    "64",
    "--rounds",
    "5",
    "--no-vllm-bench",
    "--target-fraction",
    "0.95",
)
"""As ``make demo`` serves the real model (eager vLLM, 512-token context, the checkpoint's float32): 64
requests of ≤ 128 pydoc test tokens + 64 generated (``ignore_eos``) per model and round, all at once."""

LOADTEST_NAMES = {"pruned": "v27", "lora": "v27-lora", "distill": "v27-distill"}
"""Served names: the perplexity objective's best variant (27 % of the blocks removed), its healed children."""

LOADTEST_HEALED = ("lora",)
"""Healed children served beside it (each costs one more engine on the 2 cores)."""

LOADTEST_TITLE = "## SmolLM2-135M: load test"

BUSY_LOAD = 1.5
"""A 1-minute load average above this on 2 cores means other work shared the machine; the docs say so."""

THREADS_NOTE = (
    "One torch thread (`OMP_NUM_THREADS=1`): the 2-core machine was shared with other jobs, and under "
    "contention two threads ran the same evaluator 2.4× slower (20 s against 8.5 s per single-block subset)."
)

QUALITY_TITLE = "## SmolLM2-135M: held-out quality"

SEARCHES_TITLE = "## SmolLM2-135M: searches"

EVALUATOR_TITLE = "## SmolLM2-135M: subset evaluator"

HEALING_TITLE = "## SmolLM2-135M: healing"

SEARCHES_SKIPPED = (
    "Not run on the real model: greedy (212 subsets at M = 8, about 25 min here), beam (several times "
    "greedy), bayesian and evolution (hundreds of subsets), cbo (a gradient surrogate that trains on scored "
    "subsets) and exhaustive (5.9 M subsets); the demo model's table above has them all."
)


def loadavg() -> list[float]:
    """The 1-, 5- and 15-minute load averages, rounded."""
    return [round(value, 2) for value in os.getloadavg()]


class Results:
    """The records of one results directory."""

    def __init__(self, directory: Path):
        self.directory = directory

    def record(self, stage: str) -> dict | None:
        """The record of ``stage``, or None when it has not run."""
        path = self.directory / f"{stage}.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def variants(self, objective: str) -> list[dict]:
        """The ``prune --json`` lines of the objective's searches (empty before they ran)."""
        record = self.record(f"searches-{objective}")
        return record["output"] if record else []

    def variant(self, objective: str, search: str) -> dict:
        """The variant ``search`` found under ``objective``; ``best``: the lowest calibration loss."""
        if search == "best" and self.variants(objective):
            return min(self.variants(objective), key=lambda line: line["calibration_loss"])
        for line in self.variants(objective):
            if line["search"] == search:
                return line
        raise SystemExit(f"no {search} variant of {objective}: run the stage searches-{objective} first")

    def quality_names(self) -> list[str]:
        """Registry names of dense and every variant whose held-out quality is measured, without repeats."""
        names = [MODEL] + [
            self.variant(objective, search)["name"] for objective, search in self.quality_pairs()
        ]
        return list(dict.fromkeys(names))

    def quality_pairs(self) -> list[tuple[str, str]]:
        """``(objective, search)`` of every variant whose held-out quality is measured (searches that ran)."""
        ran = [objective for objective in CALIBRATION if self.variants(objective)]
        return [(objective, search) for objective in ran for search in QUALITY_SEARCHES]

    def quality(self, name: str) -> dict | None:
        """``{"perplexity", "acc", "acc_norm", "record"}`` of ``eval`` on model ``name``, or None."""
        record = self.record(f"quality-{name}")
        if record is None:
            return None
        metrics = {"record": record}
        for result in record["output"][0]["results"]:
            key = "perplexity" if result["metric"] == "perplexity" else result["metric"]
            metrics[key] = result["value"]
            metrics.setdefault("settings", {})[key] = result["settings"]
        return metrics


def heal_outcome(record: dict) -> dict:
    """The ``heal --json`` line of a heal record."""
    output = record["output"]
    return output[0] if isinstance(output, list) else output


def load_note(record: dict) -> str:
    """``load 3.1 → 2.9`` (1-minute load average before and after), flagged when the machine was busy."""
    before, after = record["load_before"][0], record["load_after"][0]
    busy = " (**under load**)" if max(before, after) > BUSY_LOAD else ""
    return f"load {before:.1f} → {after:.1f}{busy}"
