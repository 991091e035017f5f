"""The registry's work queue (``registry.work_queue``) and ``depthprune study --worker`` built on it.

The queue's tests run on SQLite and on a real PostgreSQL server (a throwaway cluster from the installed
server binaries, or ``DEPTHPRUNE_TEST_POSTGRES_URL``; skipped without either unless
``DEPTHPRUNE_REQUIRE_POSTGRES`` is set, as in ``tests/test_registry.py``): claims, no cell claimed twice
under concurrent threads and processes, a lapsed lease reclaimed, a done cell never run again, and the worker
loop on cheap cells. The end-to-end test runs two ``depthprune study --worker`` processes on a tiny model
against PostgreSQL, SIGKILLs one mid-cell and checks that the other takes the cell over and that every
cell ran exactly once.

    .venv/bin/python -m pytest tests/test_work_queue.py -q
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from depthprune.testing.postgres import (
    create_database_at,
    drop_database_at,
)
from registry import open_registry
from registry.work_queue import DONE, FAILED, PENDING, RUNNING, WorkQueue, study_key

KEY = study_key({"study": "test"})

# ------------------------------------------------------------------------------ fixtures


@pytest.fixture
def postgres_url(postgres_admin_url):
    """A fresh, empty PostgreSQL database."""
    name = f"queue_test_{uuid.uuid4().hex[:12]}"
    url = create_database_at(postgres_admin_url, name)
    yield url
    drop_database_at(postgres_admin_url, name)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def registry_url(request, tmp_path):
    """A fresh, empty registry database on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def registry(registry_url):
    with open_registry(registry_url) as opened:
        yield opened


def queue_of(registry, worker: str, **settings) -> WorkQueue:
    return WorkQueue(registry, KEY, worker=worker, **settings)


def states(queue: WorkQueue) -> dict[str, str]:
    return {cell.cell_key: cell.state for cell in queue.cells()}


# ------------------------------------------------------------------------------ claiming


def test_claims_take_cells_in_order_and_never_the_same_twice(registry):
    first, second = queue_of(registry, "w1"), queue_of(registry, "w2")
    assert first.enqueue(["a", "b", "c"]) == 3
    assert [first.claim().cell_key, second.claim().cell_key, first.claim().cell_key] == ["a", "b", "c"]
    assert second.claim() is None
    assert first.counts().running == 3
    held = {cell.cell_key: cell.worker for cell in first.cells()}
    assert held == {"a": "w1", "b": "w2", "c": "w1"}
    assert all(cell.lease_expires_at is not None and cell.attempts == 1 for cell in first.cells())


def test_enqueue_again_adds_only_new_cells_and_keeps_their_states(registry):
    queue = queue_of(registry, "w1")
    queue.enqueue(["a", "b"])
    claim = queue.claim()
    queue.complete(claim, None)
    assert queue.enqueue(["a", "b", "c", "c"]) == 1
    assert states(queue) == {"a": DONE, "b": PENDING, "c": PENDING}
    # another study's cells are another queue
    other = WorkQueue(registry, study_key({"study": "other"}), worker="w1")
    assert other.enqueue(["a"]) == 1 and other.claim().cell_key == "a"


def test_a_done_cell_is_never_claimed_again(registry):
    first = queue_of(registry, "w1", lease_seconds=0.2)
    second = queue_of(registry, "w2", lease_seconds=0.2)
    first.enqueue(["a"])
    claim = first.claim()
    assert first.complete(claim, None)
    time.sleep(0.4)  # past the lease: a done cell has none
    assert second.claim() is None
    second.enqueue(["a"])
    assert second.claim() is None
    assert not first.complete(claim, None) and not second.release(claim)
    assert first.counts().done == 1 and first.counts().settled


def test_a_lapsed_lease_is_reclaimed_and_the_old_holder_cannot_finish(registry):
    first = queue_of(registry, "w1", lease_seconds=0.3)
    second = queue_of(registry, "w2", lease_seconds=30)
    first.enqueue(["a"])
    stale = first.claim()
    assert second.claim() is None  # the lease holds
    time.sleep(0.5)
    taken = second.claim()
    assert (taken.cell_key, taken.attempts, taken.worker) == ("a", 2, "w2")
    assert not first.renew(stale) and not first.complete(stale, None) and not first.fail(stale, "x")
    assert second.complete(taken, None)
    [cell] = second.cells()
    assert (cell.state, cell.worker, cell.attempts) == (DONE, "w2", 2)


def test_the_heartbeat_keeps_a_long_cell_claimed(registry):
    first = queue_of(registry, "w1", lease_seconds=0.6)
    second = queue_of(registry, "w2", lease_seconds=0.6)
    first.enqueue(["a"])
    claim = first.claim()
    with first.heartbeat(claim) as lease:
        time.sleep(1.5)  # two and a half leases
        assert second.claim() is None
    assert not lease.lost.is_set()
    time.sleep(0.8)  # the heartbeat stopped: the lease lapses
    assert second.claim().cell_key == "a"


def test_a_cell_whose_workers_keep_dying_is_failed(registry):
    queue = queue_of(registry, "w1", lease_seconds=0.1, max_attempts=2)
    queue.enqueue(["deadly", "fine"])
    assert queue.claim().cell_key == "deadly"
    time.sleep(0.2)
    assert queue.claim().attempts == 2  # the same cell, taken over
    assert queue.claim().cell_key == "fine"
    time.sleep(0.2)
    queue.claim()  # "deadly" lapsed twice: failed, and "fine" is taken over instead
    cells = {cell.cell_key: cell for cell in queue.cells()}
    assert cells["deadly"].state == FAILED and "abandoned: 2 workers" in cells["deadly"].error
    assert cells["fine"].state == RUNNING and cells["fine"].attempts == 2


def test_failed_cells_are_retried_by_the_next_enqueue_and_release_gives_back(registry):
    queue = queue_of(registry, "w1")
    queue.enqueue(["a", "b"])
    assert queue.fail(queue.claim(), "RuntimeError: boom")
    assert queue.release(queue.claim())
    cells = {cell.cell_key: cell for cell in queue.cells()}
    assert (cells["a"].state, cells["a"].error) == (FAILED, "RuntimeError: boom")
    assert (cells["b"].state, cells["b"].attempts) == (PENDING, 0)
    assert queue.counts().settled is False
    queue.enqueue(["a", "b"])
    assert [(cell.state, cell.attempts, cell.error) for cell in queue.cells()] == [(PENDING, 0, None)] * 2


def test_a_done_cell_keeps_its_variant_until_the_variant_is_removed(registry):
    from depthprune.testing.variants import register_example_base, register_example_variant

    register_example_base(registry)
    variant = register_example_variant(registry)
    queue = queue_of(registry, "w1")
    queue.enqueue(["a", "b"])
    assert queue.complete(queue.claim(), variant.id)
    assert [cell.variant_id for cell in queue.cells()] == [variant.id, None]
    registry.remove_variant(variant.name)
    [cell, _] = queue.cells()
    assert (cell.state, cell.variant_id) == (DONE, None)  # the result is gone: a worker reopens the cell
    assert queue.reopen(["a", "b"]) == 1  # only done cells
    assert states(queue) == {"a": PENDING, "b": PENDING}


def test_threads_claiming_at_once_never_share_a_cell(registry):
    cells = [f"cell-{index}" for index in range(40)]
    queue_of(registry, "setup").enqueue(cells)
    claimed: list[tuple[str, str]] = []
    start = threading.Barrier(8)

    def work(worker: str) -> None:
        queue = queue_of(registry, worker)
        start.wait()
        while (claim := queue.claim()) is not None:
            claimed.append((worker, claim.cell_key))
            assert queue.complete(claim, None)

    threads = [threading.Thread(target=work, args=(f"w{index}",)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(key for _, key in claimed) == sorted(cells)
    assert queue_of(registry, "check").counts().done == len(cells)


def _claim_all_from_another_process(url: str, worker: str) -> list[str]:
    with open_registry(url) as registry:
        queue = queue_of(registry, worker)
        queue.enqueue(f"cell-{index}" for index in range(60))  # every worker enqueues the whole grid
        claimed = []
        while (claim := queue.claim()) is not None:
            claimed.append(claim.cell_key)
            time.sleep(0.001)
            queue.complete(claim, None)
        return claimed


@pytest.mark.slow
def test_processes_claiming_at_once_never_share_a_cell(registry_url):
    with multiprocessing.get_context("fork").Pool(4) as pool:
        results = pool.starmap(_claim_all_from_another_process, [(registry_url, f"p{i}") for i in range(4)])
    claimed = Counter(key for keys in results for key in keys)
    assert set(claimed) == {f"cell-{index}" for index in range(60)}
    assert max(claimed.values()) == 1
    with open_registry(registry_url) as registry:
        assert queue_of(registry, "check").counts().done == 60


# ------------------------------------------------------------------------------ the worker loop


def test_workers_share_the_cells_and_a_failing_cell_does_not_stop_them(registry):
    from pruning.study.worker import work_through

    cells = [f"cell-{index}" for index in range(12)]
    queue_of(registry, "setup").enqueue(cells)
    runs: list[tuple[str, str]] = []

    def run_cell(key: str) -> None:
        runs.append((threading.current_thread().name, key))
        time.sleep(0.02)
        if key == "cell-5":
            raise RuntimeError("this cell always fails")

    results = {}

    def work(worker: str) -> None:
        results[worker] = work_through(queue_of(registry, worker), run_cell, poll_seconds=0.05, say=print)

    threads = [threading.Thread(target=work, args=(name,), name=name) for name in ("w1", "w2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(key for _, key in runs) == sorted(cells)  # each cell ran exactly once
    assert results["w1"].done == results["w2"].done == 11
    assert results["w1"].failed == 1
    [failed] = [cell for cell in queue_of(registry, "check").cells() if cell.state == FAILED]
    assert (failed.cell_key, failed.error) == ("cell-5", "RuntimeError: this cell always fails")


def test_a_worker_waits_for_cells_another_holds_then_leaves(registry):
    from pruning.study.worker import work_through

    holder = queue_of(registry, "holder")
    holder.enqueue(["held", "free"])
    held = holder.claim()
    ran: list[str] = []
    finished = threading.Event()

    def other_worker() -> None:
        work_through(queue_of(registry, "other"), ran.append, poll_seconds=0.05, say=print)
        finished.set()

    thread = threading.Thread(target=other_worker)
    thread.start()
    time.sleep(0.5)
    assert ran == ["free"] and not finished.is_set()  # waiting for "held"
    holder.complete(held, None)
    thread.join(timeout=10)
    assert finished.is_set() and ran == ["free"]


def test_an_interrupted_cell_is_given_back_at_once(registry):
    from pruning.study.worker import work_through

    queue = queue_of(registry, "w1")
    queue.enqueue(["a"])

    def interrupted(key: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        work_through(queue, interrupted, poll_seconds=0.05, say=print)
    [cell] = queue.cells()
    assert (cell.state, cell.attempts) == (PENDING, 0)


def dense_waits_for_a_cell_another_worker_holds(registry):
    """Worker w1's queue of two cells, "first" claimed by worker w2 (whose queue and claim come back too)."""
    queue = queue_of(registry, "w1")
    queue.enqueue(["first", "dense"])
    other = queue_of(registry, "w2")
    return queue, other, other.claim()


def test_a_cell_not_ready_waits_for_the_others_and_fails_when_none_is_left(registry):
    from pruning.study.worker import CellNotReady, work_through

    queue, other, first = dense_waits_for_a_cell_another_worker_holds(registry)
    ran: list[str] = []

    def run_cell(key: str) -> None:
        if key == "dense" and queue.counts().done == 0:
            raise CellNotReady("needs a cell done")
        ran.append(key)

    threading.Timer(0.4, lambda: other.complete(first, None)).start()
    assert work_through(queue, run_cell, poll_seconds=0.05, say=print).done == 2
    assert ran == ["dense"]
    # alone and nothing in progress: the cell can never become ready
    lonely = WorkQueue(registry, study_key({"study": "lonely"}), worker="w1")
    lonely.enqueue(["dense"])

    def never_ready(key: str) -> None:
        raise CellNotReady("needs a cell done")

    assert work_through(lonely, never_ready, poll_seconds=0.05, say=print).failed == 1
    [cell] = lonely.cells()
    assert cell.error == "not ready: needs a cell done"


def test_a_cell_made_ready_during_its_attempt_is_tried_again(registry):
    # The race the test above met at random: the other cell finished after this attempt looked at it and
    # before the worker counted what is left, so nothing was in progress and the cell was failed.
    from pruning.study.worker import CellNotReady, work_through

    queue, other, first = dense_waits_for_a_cell_another_worker_holds(registry)
    attempts: list[str] = []

    def run_cell(key: str) -> None:
        attempts.append(key)
        if len(attempts) == 1:
            other.complete(first, None)  # after this attempt found it not done, before the worker counts
            raise CellNotReady("needs a cell done")

    assert work_through(queue, run_cell, poll_seconds=0.01, say=print).done == 2
    assert attempts == ["dense", "dense"]


def test_the_study_key_ignores_where_a_worker_writes_and_runs(tmp_path):
    from pruning.study.plan import StudyConfig, StudyPlan
    from pruning.study.worker import study_arguments

    def key(**fields) -> str:
        config = StudyConfig(model="m", drops=(2,), searches=("greedy", "beam"), **fields)
        return study_key(study_arguments(StudyPlan(config, "/abs/m", 6, None, [])))

    same = key(out=tmp_path / "a", device="cuda:0", worker=True, lease_seconds=5, engine="vllm")
    assert same == key(out=tmp_path / "b", device="cpu", registry_url="sqlite:///x.db", progress=False)
    assert same == key(device="cuda", worker=True, engine="torch", workers_per_gpu=6, keep_weights="none")
    assert key(seeds=(0, 1)) != same
    assert key(samples=32) != same


# ------------------------------------------------------------------------------ end to end


def _start_worker(model: Path, url: str, root: Path, name: str) -> tuple[subprocess.Popen, Path]:
    """``depthprune study --worker`` with its own DEPTHPRUNE_HOME and --out (as on another machine)."""
    log = root / f"{name}.log"
    command = [
        sys.executable, "-m", "depthprune", "study", "--model", str(model), "--drop", "2",
        "--searches", "one_shot,greedy", "--samples", "4", "--seq-len", "32", "--engine", "torch",
        "--eval-seq-len", "32", "--out", str(root / f"report-{name}"), "--registry", url,
        "--worker", "--lease-seconds", "3",
    ]  # fmt: skip
    environment = {**os.environ, "DEPTHPRUNE_HOME": str(root / f"home-{name}")}
    with open(log, "w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=environment)
    return process, log


def _running_workers(registry) -> dict[int, str]:
    """``pid -> cell key`` of the cells held now (worker ids are ``host:pid:random``)."""
    from sqlalchemy import select

    from registry.tables import StudyCellRow

    with registry.engine.connect() as connection:
        rows = connection.execute(
            select(StudyCellRow.worker, StudyCellRow.cell_key).where(StudyCellRow.state == RUNNING)
        ).all()
    return {int(worker.split(":")[1]): key for worker, key in rows}


def _wait_until(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
@pytest.mark.postgres
def test_two_study_workers_share_the_grid_and_survive_a_killed_worker(tiny_demo_like, postgres_url, tmp_path):
    first, first_log = _start_worker(tiny_demo_like, postgres_url, tmp_path, "first")
    second, second_log = _start_worker(tiny_demo_like, postgres_url, tmp_path, "second")
    try:
        with open_registry(postgres_url) as registry:
            # both workers hold a cell at the same moment; then the first is killed in the middle of its cell
            def both_hold_a_cell() -> dict[int, str] | None:
                held = _running_workers(registry)
                return held if {first.pid, second.pid} <= set(held) else None

            held = _wait_until(both_hold_a_cell, timeout_s=240, what="both workers to hold a cell")
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=30)
            killed_cell = held[first.pid]
            assert second.wait(timeout=400) == 0, second_log.read_text()
    finally:
        for process in (first, second):
            if process.poll() is None:
                process.kill()
                process.wait()
    output = {"first": first_log.read_text(), "second": second_log.read_text()}
    with open_registry(postgres_url) as registry:
        [study] = {cell.study_key for cell in _all_cells(registry)}
        cells = {cell.cell_key: cell for cell in _all_cells(registry)}
        assert len(cells) == 5 and "dense" in cells  # 2 objectives x 2 searches, and the dense evaluation
        assert all(cell.state == DONE for cell in cells.values())
        assert cells[killed_cell].attempts == 2 and cells[killed_cell].worker.split(":")[1] == str(second.pid)
        assert [cell.attempts for key, cell in cells.items() if key != killed_cell] == [1] * 4
        # every cell finished exactly once, by one worker or the other
        lines = [line for text in output.values() for line in text.splitlines()]
        finished = Counter(line.split(": done ", 1)[1] for line in lines if ": done " in line)
        assert finished == Counter(list(cells))
        assert f"cell {killed_cell} (attempt 2)" in output["second"]
        variants = registry.list_variants(str(tiny_demo_like))
        assert len(variants) == 4  # one per grid cell, never registered twice
        for cell in cells.values():
            if cell.cell_key != "dense":
                assert {e.task for e in registry.evaluations(cell.variant_id)} >= {"demo_text", "demo_qa"}
        assert {e.task for e in registry.evaluations(str(tiny_demo_like))} >= {"demo_text", "demo_qa"}
    report = json.loads((tmp_path / "report-second" / "study.json").read_text())
    assert len(report["cells"]) == 4 and set(report["dense"]) >= {"demo_text/perplexity"}

    # a worker started after the end runs nothing and writes the same report from the registry
    third, third_log = _start_worker(tiny_demo_like, postgres_url, tmp_path, "third")
    assert third.wait(timeout=300) == 0, third_log.read_text()
    assert ": cell " not in third_log.read_text() and study[:12] in third_log.read_text()
    again = json.loads((tmp_path / "report-third" / "study.json").read_text())
    # a checkpoint is recorded relative to the writer's home when it lies inside it: the second worker's own
    # cells read "variants/...", the third names the second's home in full; both resolve to one directory
    second_home, third_home = tmp_path / "home-second", tmp_path / "home-third"
    assert _resolved_cells(again, third_home) == _resolved_cells(report, second_home)
    assert again["dense"] == report["dense"]


def _resolved_cells(report: dict, home: Path) -> list[dict]:
    from pruning.study.paths import resolved_path

    return [{**cell, "checkpoint": resolved_path(cell["checkpoint"], home)} for cell in report["cells"]]


def _all_cells(registry):
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from registry.tables import StudyCellRow

    with Session(registry.engine) as session:
        return list(session.scalars(select(StudyCellRow).order_by(StudyCellRow.id)))
