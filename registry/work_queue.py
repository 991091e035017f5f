"""The registry as a work queue: study cells claimed one at a time by workers on any number of machines.

``depthprune study --worker`` runs here on the registry side. Every worker started with the same study
arguments computes the same :func:`study_key` and so shares one queue, the rows of ``study_cells`` with that
key. A worker :meth:`~WorkQueue.enqueue` s the grid (rows that exist already are kept), then repeatedly
:meth:`~WorkQueue.claim` s one cell, runs it while a :class:`Heartbeat` thread renews its lease, and marks it
:meth:`~WorkQueue.complete` (or :meth:`~WorkQueue.fail`)::

    queue = WorkQueue(registry, study_key(arguments), lease_seconds=120)
    queue.enqueue(cell_keys)
    while (claim := queue.claim()) is not None:
        with queue.heartbeat(claim) as lease:
            variant_id = run(claim.cell_key)
        queue.complete(claim, variant_id)

How the guarantees are kept:

* **No two workers hold one cell.** A claim is one transaction that selects the first claimable row and
  marks it ``running``. On PostgreSQL the select is ``SELECT ... FOR UPDATE SKIP LOCKED``: a row another
  worker is claiming is skipped rather than waited for, so concurrent claims take different rows. On SQLite
  (one machine) the transaction begins with ``BEGIN IMMEDIATE``, which takes the database's write lock
  first, so claims run one after another; the same code runs on both.
* **A killed worker's cell is reclaimed.** A claim holds a lease (``lease_expires_at``); the heartbeat
  renews it every third of the lease. A worker that dies stops renewing, its lease expires and the cell is
  claimable again (``attempts`` counts the claims). A cell whose workers died ``max_attempts`` times is
  failed instead of being handed to the next worker to kill.
* **A cell done is never run again.** ``done`` is terminal for :meth:`~WorkQueue.claim`, and one row per
  (study, cell) is enforced by a unique constraint. Completing, failing or releasing a cell checks that this
  worker still holds it, so a worker that lost its lease cannot overwrite the result of the one that took
  the cell over. The one way a cell can run twice is a worker alive but unable to reach the database for
  longer than its lease: it keeps computing while another worker reclaims the cell (the variant is
  registered once either way, the registry's identity is the same).

Lease times are the database's clock on PostgreSQL (``now()``), so machines' clocks need not agree; SQLite
serves one machine, whose clock is the only one.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from ground.core.errors import UserError
from registry.database import WRITE_OPTION, retrying
from registry.tables import StudyCellRow, utc, utc_now

PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
"""The states of a cell: waiting, held by a worker, finished, given up on (until the next enqueue)."""
STATES = (PENDING, RUNNING, DONE, FAILED)
DEFAULT_LEASE_SECONDS = 120.0
"""How long a claim lasts without a heartbeat: a killed worker's cell waits this long to be reclaimed."""
PERMANENT_PREFIX = "permanent: "
"""Start of a failure another attempt would repeat (out of memory on that card): enqueue keeps it failed."""
DEFAULT_MAX_ATTEMPTS = 3
"""Claims of a cell whose workers all stopped without finishing it, after which it is failed."""


def study_key(arguments: dict[str, Any]) -> str:
    """The queue's name for a study: sha256 of the canonical JSON of its arguments.

    Args:
        arguments: what defines the study's cells and results (not where one worker writes its files).

    Returns:
        64 hex digits.
    """
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def default_worker_id() -> str:
    """``host:pid:random``: unique per worker process, and readable in ``study_cells.worker``."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class Claim:
    """A cell this worker holds."""

    row_id: int
    """Row id in ``study_cells``."""
    cell_key: str
    """The cell."""
    attempts: int
    """Claims of the cell so far, this one included (more than 1: an earlier worker stopped on it)."""
    worker: str
    """The worker holding it."""


@dataclass(frozen=True)
class CellState:
    """One row of the queue, as :meth:`WorkQueue.cells` reports it."""

    cell_key: str
    state: str
    """``pending``, ``running``, ``done`` or ``failed``."""
    worker: str | None
    """Who holds it (``running``) or who last held it."""
    attempts: int
    lease_expires_at: datetime | None
    variant_id: int | None
    """The registry variant the cell produced (``done``); None for a cell that produces none."""
    error: str | None
    """Why it failed."""
    claimed_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True)
class QueueCounts:
    """How many cells of the study are in each state."""

    pending: int = 0
    running: int = 0
    done: int = 0
    failed: int = 0

    @property
    def total(self) -> int:
        return self.pending + self.running + self.done + self.failed

    @property
    def settled(self) -> bool:
        """Nothing left to claim or to wait for: every cell is done or failed."""
        return self.pending == 0 and self.running == 0


class WorkQueue:
    """The cells of one study in the registry's ``study_cells`` table, seen by one worker."""

    def __init__(
        self,
        registry,
        key: str,
        *,
        worker: str | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    ):
        """
        Args:
            registry: an open :class:`registry.api.Registry` (SQLite or PostgreSQL).
            key: the study's :func:`study_key`.
            worker: this worker's id; default :func:`default_worker_id`.
            lease_seconds: how long a claim lasts without renewal.
            max_attempts: claims after which a cell whose workers keep dying is failed.
        """
        if not lease_seconds > 0:
            raise UserError(f"the lease must be positive, got {lease_seconds} s")
        if max_attempts < 1:
            raise UserError(f"max_attempts must be at least 1, got {max_attempts}")
        self.key = key
        self.worker = worker or default_worker_id()
        self.lease = timedelta(seconds=lease_seconds)
        self.max_attempts = max_attempts
        self._engine = registry.engine
        self._write_engine = registry.engine.execution_options(**{WRITE_OPTION: True})
        self._postgres = registry.engine.dialect.name == "postgresql"

    def __repr__(self) -> str:
        return f"WorkQueue({self.key[:12]}..., worker={self.worker!r})"

    def _write(self, operation):
        """``operation(session)`` in one write transaction (``BEGIN IMMEDIATE`` on SQLite), retried."""

        def attempt():
            with Session(self._write_engine) as session, session.begin():
                return operation(session)

        return retrying(attempt)

    def _now(self, session: Session) -> datetime:
        """The database's clock on PostgreSQL (machines may disagree); this machine's on SQLite."""
        if self._postgres:
            return session.scalar(select(func.now()))
        return utc_now()

    # ---------------------------------------------------------------- filling

    def enqueue(self, cell_keys: Iterable[str]) -> int:
        """Add the cells not yet in the queue as ``pending``, and put failed cells back to ``pending``
        (not those whose error is permanent: :data:`PERMANENT_PREFIX`).

        Cells already pending, running or done are left as they are, so every worker may enqueue the whole
        grid when it starts. Failed cells are retried by the next worker that starts (as re-running a study
        retries what failed).

        Returns:
            How many cells were added.
        """
        keys = list(dict.fromkeys(cell_keys))

        def operation(session: Session) -> int:
            now = self._now(session)
            present = set(
                session.scalars(select(StudyCellRow.cell_key).where(StudyCellRow.study_key == self.key))
            )
            missing = [key for key in keys if key not in present]
            session.add_all(
                StudyCellRow(study_key=self.key, cell_key=key, state=PENDING, attempts=0, created_at=now)
                for key in missing
            )
            session.execute(
                update(StudyCellRow)
                .where(
                    StudyCellRow.study_key == self.key,
                    StudyCellRow.state == FAILED,
                    StudyCellRow.error.is_(None) | ~StudyCellRow.error.startswith(PERMANENT_PREFIX),
                )
                .values(state=PENDING, worker=None, attempts=0, error=None, lease_expires_at=None)
            )
            return len(missing)

        # Two workers adding the same new row at once: one fails on the unique constraint and is retried.
        return self._write(operation)

    def reopen(self, cell_keys: Iterable[str]) -> int:
        """Put done cells back to ``pending`` (their result is gone, e.g. its variant was removed).

        Returns:
            How many cells were reopened.
        """
        keys = list(cell_keys)
        if not keys:
            return 0

        def operation(session: Session) -> int:
            result = session.execute(
                update(StudyCellRow)
                .where(
                    StudyCellRow.study_key == self.key,
                    StudyCellRow.state == DONE,
                    StudyCellRow.cell_key.in_(keys),
                )
                .values(state=PENDING, attempts=0, variant_id=None, finished_at=None)
            )
            return result.rowcount

        return self._write(operation)

    # ---------------------------------------------------------------- claiming

    def claim(self) -> Claim | None:
        """Take the first pending cell, or a running one whose lease expired (its worker stopped).

        Returns:
            The claim, or None when no cell is claimable now (all done, failed, or held by live workers).
        """

        def operation(session: Session) -> Claim | None:
            now = self._now(session)
            claimable = (
                select(StudyCellRow)
                .where(
                    StudyCellRow.study_key == self.key,
                    or_(
                        StudyCellRow.state == PENDING,
                        and_(StudyCellRow.state == RUNNING, StudyCellRow.lease_expires_at < now),
                    ),
                )
                .order_by(StudyCellRow.id)
                .limit(1)
                # PostgreSQL: rows other workers are claiming are skipped, not waited for. SQLite renders
                # nothing here; its BEGIN IMMEDIATE already made this transaction the only writer.
                .with_for_update(skip_locked=True)
            )
            while (row := session.scalar(claimable)) is not None:
                if row.state == RUNNING and row.attempts >= self.max_attempts:
                    row.state, row.finished_at, row.lease_expires_at = FAILED, now, None
                    row.error = (
                        f"abandoned: {row.attempts} workers stopped without finishing it (last: {row.worker})"
                    )
                    session.flush()
                    continue
                row.state, row.worker, row.attempts = RUNNING, self.worker, row.attempts + 1
                row.claimed_at, row.lease_expires_at, row.error = now, now + self.lease, None
                return Claim(row.id, row.cell_key, row.attempts, self.worker)
            return None

        return self._write(operation)

    def _update_held(self, claim: Claim, values: Callable[[datetime], dict[str, Any]]) -> bool:
        """Set ``values(now)`` on the row of ``claim`` if this worker still holds it; whether it did."""

        def operation(session: Session) -> bool:
            result = session.execute(
                update(StudyCellRow)
                .where(
                    StudyCellRow.id == claim.row_id,
                    StudyCellRow.worker == self.worker,
                    StudyCellRow.state == RUNNING,
                )
                .values(**values(self._now(session)))
            )
            return result.rowcount == 1

        return self._write(operation)

    def renew(self, claim: Claim) -> bool:
        """Extend the lease of ``claim`` to the lease length from now.

        Returns:
            False when this worker no longer holds the cell (its lease expired and another worker took it).
        """
        return self._update_held(claim, lambda now: {"lease_expires_at": now + self.lease})

    def complete(self, claim: Claim, variant_id: int | None = None) -> bool:
        """Mark the cell done with the variant it produced.

        Returns:
            False when this worker no longer held it (then nothing is changed).
        """
        return self._update_held(
            claim,
            lambda now: dict(state=DONE, variant_id=variant_id, lease_expires_at=None, finished_at=now),
        )

    def fail(self, claim: Claim, error: str) -> bool:
        """Mark the cell failed with ``error``; the next worker to start retries it.

        Returns:
            False when this worker no longer held it.
        """
        return self._update_held(
            claim, lambda now: {"state": FAILED, "error": error, "lease_expires_at": None, "finished_at": now}
        )

    def release(self, claim: Claim) -> bool:
        """Give the cell back (``pending``, the claim not counted), e.g. when the worker is interrupted, for
        another worker to take at once.

        Returns:
            False when this worker no longer held it.
        """
        return self._update_held(
            claim,
            lambda now: {"state": PENDING, "lease_expires_at": None, "attempts": StudyCellRow.attempts - 1},
        )

    @contextmanager
    def heartbeat(self, claim: Claim) -> Iterator[Heartbeat]:
        """Renew the lease of ``claim`` in a background thread for the length of the ``with`` block."""
        beat = Heartbeat(self, claim)
        beat.start()
        try:
            yield beat
        finally:
            beat.stop()

    # ---------------------------------------------------------------- reading

    def cells(self) -> list[CellState]:
        """Every cell of the study, in the order they were enqueued."""
        with Session(self._engine) as session:
            rows = session.scalars(
                select(StudyCellRow).where(StudyCellRow.study_key == self.key).order_by(StudyCellRow.id)
            )
            return [
                CellState(
                    cell_key=row.cell_key,
                    state=row.state,
                    worker=row.worker,
                    attempts=row.attempts,
                    lease_expires_at=utc(row.lease_expires_at),
                    variant_id=row.variant_id,
                    error=row.error,
                    claimed_at=utc(row.claimed_at),
                    finished_at=utc(row.finished_at),
                )
                for row in rows
            ]

    def counts(self) -> QueueCounts:
        """How many cells are pending, running, done and failed."""
        with Session(self._engine) as session:
            found = dict(
                session.execute(
                    select(StudyCellRow.state, func.count())
                    .where(StudyCellRow.study_key == self.key)
                    .group_by(StudyCellRow.state)
                ).all()
            )
        return QueueCounts(**{state: found.get(state, 0) for state in STATES})


class Heartbeat:
    """A daemon thread that renews a claim's lease every third of the lease until stopped.

    A renewal that fails on a database error is tried again at the next beat (the lease has two more beats
    of slack). When the claim turns out to be lost, :attr:`lost` is set and the thread ends.
    """

    def __init__(self, queue: WorkQueue, claim: Claim):
        self.queue = queue
        self.claim = claim
        self.interval_s = queue.lease.total_seconds() / 3
        self.lost = threading.Event()
        """Set when the lease was found taken over: the cell's result will not be recorded by this worker."""
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{claim.row_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            try:
                held = self.queue.renew(self.claim)
            except Exception as error:  # a database hiccup: the next beat tries again
                print(f"work queue: heartbeat of {self.claim.cell_key} failed: {error}", file=sys.stderr)
                continue
            if not held:
                self.lost.set()
                return
