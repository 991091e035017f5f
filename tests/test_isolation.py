"""One GPU job per process (pruning.runtime.isolation): results and errors come back, an out-of-memory error
is permanent, and the parent's memory is back at its baseline after every job (measured by RSS on CPU)."""

from __future__ import annotations

import random

import pytest

from depthprune.testing.processes import fail_with, hold_memory, resident_bytes
from pruning.runtime.isolation import OutOfMemory, run_in_own_process
from registry.work_queue import PERMANENT_PREFIX

MIB = 1024 * 1024


def test_results_and_errors_come_back_and_out_of_memory_is_permanent():
    assert run_in_own_process(hold_memory, 8) == 8 * MIB
    with pytest.raises(ValueError, match="ordinary"):
        run_in_own_process(fail_with, "value")
    with pytest.raises(OutOfMemory, match=PERMANENT_PREFIX + "out of memory") as caught:
        run_in_own_process(fail_with, "memory")
    assert "--dry-run" in str(caught.value)


def test_parent_memory_returns_to_baseline_between_jobs():
    baseline = resident_bytes()
    for _ in range(3):  # three "cells" of 300 MiB each, one process each
        assert run_in_own_process(hold_memory, 300) == 300 * MIB
        assert resident_bytes() - baseline < 40 * MIB


@pytest.mark.slow
def test_evaluation_in_its_own_process_gives_the_same_numbers(tmp_path):
    from depthprune.testing.data import random_words
    from depthprune.testing.models import save_tiny_model
    from pruning.evaluation.suites import EvalSettings, PreparedData, evaluate_model

    model = save_tiny_model("llama", tmp_path / "tiny")
    rng = random.Random(0)
    prepared = PreparedData(documents={"demo_text": [random_words(rng, 300) for _ in range(4)]})
    settings = EvalSettings(suites=("demo",), engine="torch", seq_len=64, device="cpu", progress=False)
    here = evaluate_model(
        str(model), ["demo"], prepared, EvalSettings(**{**settings.__dict__, "own_process": False})
    )
    there = evaluate_model(
        str(model), ["demo"], prepared, EvalSettings(**{**settings.__dict__, "own_process": True})
    )
    assert [(r.task, r.metric) for r in here] == [(r.task, r.metric) for r in there] and here
    assert [r.value for r in here] == pytest.approx([r.value for r in there], rel=1e-9)


def test_the_work_queue_retries_an_ordinary_failure_but_not_an_out_of_memory(tmp_path):
    from pruning.study.worker import failure_message
    from registry import open_registry
    from registry.work_queue import FAILED, PENDING, WorkQueue, study_key

    registry = open_registry(f"sqlite:///{tmp_path / 'registry.db'}")
    queue = WorkQueue(registry, study_key({"study": "oom"}), worker="w1")
    queue.enqueue(["ordinary", "oom"])
    for error in (ValueError("bad data"), MemoryError("CUDA out of memory")):
        queue.fail(queue.claim(), failure_message(error))
    queue.enqueue(["ordinary", "oom"])  # what the next worker started does
    states = {cell.cell_key: (cell.state, cell.error) for cell in queue.cells()}
    assert states["ordinary"] == (PENDING, None)
    assert states["oom"][0] == FAILED and states["oom"][1].startswith(PERMANENT_PREFIX)
