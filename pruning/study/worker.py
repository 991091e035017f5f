"""Worker mode of the study (``depthprune study --worker``): the grid spread over machines sharing a registry.

A study grid on real models is days of GPU time. Start the same ``depthprune study ... --worker`` command,
with the same arguments and the same ``--registry`` (PostgreSQL for several machines; a SQLite file serves
several workers on one machine), once per GPU or machine::

    depthprune study --model meta-llama/Llama-3.1-8B --drop 8,10 --searches study --seeds 0,1,2 \\
        --registry postgresql+psycopg://user@db-host/registry --worker --device cuda:0

Every worker hashes the study's arguments into the same queue key (:func:`study_arguments`; where a worker
writes its files, its device and engine are not part of it) and enqueues the grid's cells, then one cell for
the dense model's evaluation, in the registry's work queue (:mod:`registry.work_queue`). Then each worker
claims one cell at a time, prunes it (one search, through :func:`pruning.pipeline.prune.prune`) and evaluates
the variant, while a heartbeat thread renews its lease. A cell done is never run again; a killed worker's cell
is taken over by another worker once its lease (``--lease-seconds``) expires; a cell that raised is marked
failed, the worker goes on with the others, and the next worker started retries it. The dense cell comes
last because the first pruned cell registers the dense model: a worker that claims it before any cell is
done gives it back and waits.

A worker that finds nothing to claim waits for the cells other workers hold (their leases may still
expire), and leaves when every cell is done or failed. **The report** is written by every worker, each into
its own ``--out``, once no cell is left: it is built from the registry alone (the cells' variants and
their recorded evaluations), so it is the same whichever worker writes it, and a lock file serialises
workers that share one ``--out``. Checkpoints stay on the machine that pruned them (``--checkpoints``),
the registry records where.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from ground.core.errors import UserError
from ground.core.files import exclusive_lock
from pruning.study.calibration_items import fill_calibration_items
from pruning.study.cells import (
    CellResult,
    fill_reused,
    find_in_registry,
    prune_missing,
    result_of_variant,
    save_manifest,
)
from pruning.study.evaluation import evaluate_all
from pruning.study.plan import StudyConfig, StudyPlan, cell_options, plan_study, plan_summary
from pruning.study.report import write_report

DENSE_CELL = "dense"
"""The queue's cell for the dense model's evaluation (grid cells' keys always contain ``|``)."""
LOCAL_FIELDS = frozenset(
    {
        "out",
        "checkpoints",
        "registry_url",
        "device",
        "engine",
        "progress",
        "worker",
        "lease_seconds",
        "workers_per_gpu",
        "keep_weights",
    }
)
"""StudyConfig fields that say how or where one worker runs, not what the study is: not in the queue key."""
REPORT_LOCK = ".report.lock"

CellRunner = Callable[[str], int | None]
"""Runs one cell by its key and returns the registry id of the variant it produced (None for none)."""


class CellNotReady(Exception):
    """A cell that cannot start yet (the dense evaluation before the dense model is registered)."""


def study_arguments(plan: StudyPlan) -> dict:
    """What names the study's queue: every StudyConfig field but :data:`LOCAL_FIELDS`, the model resolved.

    Fields added to StudyConfig later are part of it unless listed there, so workers never share a queue
    across settings that change results.
    """
    arguments = {
        name: value for name, value in dataclasses.asdict(plan.config).items() if name not in LOCAL_FIELDS
    }
    arguments["model"] = plan.model
    return arguments


def _ignore(*_args) -> None:
    """The grid's ``save`` callback in worker mode: the queue, not the manifest, records progress."""


class GridCellRunner:
    """Runs a cell of ``plan``: prunes it (unless the registry has it with its checkpoint here) and evaluates
    its variant; the :data:`DENSE_CELL` evaluates the dense model."""

    def __init__(self, plan: StudyPlan, registry):
        self.plan = plan
        self.registry = registry
        self.cells = {cell.key: cell for cell in plan.cells}

    def __call__(self, cell_key: str) -> int | None:
        if cell_key == DENSE_CELL:
            try:
                self.registry.get_base_model(self.plan.model)
            except UserError:
                raise CellNotReady("the dense model is registered by the first pruned cell") from None
            evaluate_all(self.plan, {}, self.registry, _ignore)
            return None
        cell = self.cells[cell_key]
        done: dict[str, CellResult] = {}
        found = find_in_registry(
            self.registry, self.plan.model, cell, cell_options(self.plan.config, self.plan.num_blocks, cell)
        )
        if found is not None:
            done[cell.key] = found
        else:
            prune_missing(self.plan, [cell], done, _ignore)
        evaluate_all(self.plan, done, self.registry, _ignore, include_dense=False)
        return self.registry.resolve(done[cell.key].variant).id


def failure_message(error: Exception) -> str:
    """What a failed cell records: an out-of-memory error is permanent (not retried) and says what to do."""
    from pruning.runtime.isolation import is_out_of_memory, out_of_memory_message

    return out_of_memory_message(error) if is_out_of_memory(error) else f"{type(error).__name__}: {error}"


def work_on(queue, claim, run_cell: CellRunner, say: Callable[[str], None]) -> bool:
    """Run one claimed cell under a heartbeat and record how it ended.

    An exception marks the cell failed (the worker goes on with other cells); an interrupt gives the cell
    back at once, so another worker need not wait for the lease, and is raised again. A cell not ready is
    given back while other cells are in progress (one of them will make it ready) or when one finished during
    the attempt (it may have made the cell ready too late for this attempt to see), else failed.

    Returns:
        False when the cell was given back as not ready (the caller waits before claiming again).
    """
    before = queue.counts()
    with queue.heartbeat(claim) as lease:
        try:
            variant_id = run_cell(claim.cell_key)
        except CellNotReady as reason:
            counts = queue.counts()
            finished_meanwhile = (counts.done, counts.failed) != (before.done, before.failed)
            if counts.running > 1 or counts.pending > 0 or finished_meanwhile:
                queue.release(claim)
                return False
            queue.fail(claim, f"not ready: {reason}")
            say(f"failed {claim.cell_key}: {reason}")
            return True
        except Exception as error:
            traceback.print_exc()
            queue.fail(claim, failure_message(error))
            say(f"failed {claim.cell_key}: {error}")
            return True
        except BaseException:
            queue.release(claim)
            raise
    if queue.complete(claim, variant_id):
        say(f"done {claim.cell_key}")
    else:
        lost = " (its heartbeat found the lease lost)" if lease.lost.is_set() else ""
        say(f"cell {claim.cell_key} was taken over by another worker{lost}; its result is that worker's")
    return True


def work_through(queue, run_cell: CellRunner, *, poll_seconds: float, say: Callable[[str], None]):
    """Claim and run cells until none is left to run or to wait for.

    Args:
        queue: the study's :class:`registry.work_queue.WorkQueue`.
        run_cell: runs one cell (see :data:`CellRunner`).
        poll_seconds: wait between looks at the queue while other workers hold the remaining cells.
        say: prints a progress line.

    Returns:
        The queue's final :class:`registry.work_queue.QueueCounts`.
    """
    last_said = None

    def say_once(message: str) -> None:  # polling must not repeat the same line
        nonlocal last_said
        if message != last_said:
            last_said = message
            say(message)

    while True:
        claim = queue.claim()
        if claim is not None:
            retry = f" (attempt {claim.attempts})" if claim.attempts > 1 else ""
            say_once(f"cell {claim.cell_key}{retry}")
            if work_on(queue, claim, run_cell, say):
                continue
        else:
            counts = queue.counts()
            if counts.settled:
                return counts
            say_once(f"waiting for {counts.running} cell(s) other workers hold")
        time.sleep(poll_seconds)


def collect_results(plan: StudyPlan, queue, registry) -> dict[str, CellResult]:
    """The results of the grid's done cells, from the variants the queue recorded."""
    from registry.work_queue import DONE

    by_key = {cell.key: cell for cell in plan.cells}
    done: dict[str, CellResult] = {}
    for state in queue.cells():
        cell = by_key.get(state.cell_key)
        if cell is not None and state.state == DONE and state.variant_id is not None:
            done[cell.key] = result_of_variant(cell, registry.resolve(state.variant_id))
    fill_reused(plan, done)  # cells a pinned draw lets copy the first seed's are never queued
    fill_calibration_items(plan, done)
    return done


def write_worker_report(plan: StudyPlan, registry, done: dict[str, CellResult]) -> Path:
    """The manifest and the report in this worker's ``--out``, from the registry's numbers."""

    out = plan.config.out
    with exclusive_lock(out / REPORT_LOCK):  # workers sharing one --out write its report in turn
        dense = evaluate_all(plan, done, registry, _ignore)  # recorded by the cells: nothing to evaluate
        save_manifest(out, plan, done, dense)
        results = [done[cell.key] for cell in plan.cells if cell.key in done]
        write_report(out, plan_summary(plan), results, dense)
    return out


def _failure_message(failed: list) -> str:
    shown = "; ".join(f"{state.cell_key}: {state.error}" for state in failed[:5])
    more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
    return (
        f"{len(failed)} study cell(s) failed ({shown}{more}); start a worker again to retry them "
        "(the report is written when every cell is done)"
    )


def run_worker(
    config: StudyConfig, *, run_cell: CellRunner | None = None, poll_seconds: float | None = None
) -> Path:
    """Work on the study of ``config`` as one of its workers, then write its report (see the module).

    Args:
        config: the study (``config.worker`` is implied).
        run_cell: runs one cell; default :class:`GridCellRunner` (tests pass a cheap one).
        poll_seconds: wait between looks at the queue while others hold the last cells; default a quarter
            of the lease, at most 10 s.

    Returns:
        The report directory.

    Raises:
        UserError: when cells failed (after every other cell was done).
    """
    from registry import open_registry
    from registry.work_queue import DONE, FAILED, WorkQueue, study_key

    plan = plan_study(config)
    registry = open_registry(config.registry_url)
    queue = WorkQueue(registry, study_key(study_arguments(plan)), lease_seconds=config.lease_seconds)

    def say(message: str) -> None:
        if config.progress:
            print(f"study worker {queue.worker}: {message}", flush=True)

    queue.enqueue([*(cell.key for cell in plan.cells if cell.reused_from is None), DENSE_CELL])
    # A done cell whose variant was removed from the registry has no result any more: run it again.
    queue.reopen(
        state.cell_key
        for state in queue.cells()
        if state.state == DONE and state.variant_id is None and state.cell_key != DENSE_CELL
    )
    counts = queue.counts()
    say(
        f"queue {queue.key[:12]}: {counts.total} cells ({counts.done} done, {counts.running} running, "
        f"{counts.pending} to run)"
    )
    poll = poll_seconds if poll_seconds is not None else min(10.0, config.lease_seconds / 4)
    counts = work_through(queue, run_cell or GridCellRunner(plan, registry), poll_seconds=poll, say=say)
    if counts.failed:
        raise UserError(_failure_message([state for state in queue.cells() if state.state == FAILED]))
    say("every cell is done; writing the report")
    return write_worker_report(plan, registry, collect_results(plan, queue, registry))
