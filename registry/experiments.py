"""A/B experiments as shared, durable state: every gateway on one registry routes by the same specs.

An experiment is one row of ``experiments`` (its current spec and an integer ``version``) and one row of
``experiment_changes`` per change (version, time, actor, the spec before and after). The registry stores a
spec as plain JSON and does not interpret it: the gateway (:mod:`server.experiment_sync`) checks it
against what it serves, and ``depthprune experiments`` checks its shape before writing::

    store = ExperimentStore(open_registry(url))
    record = store.set("llama-ab", spec, actor="cli:alice", expected_version=3)  # StaleVersion if not 3
    store.history("llama-ab")                                                  # every change, oldest first

How the guarantees are kept:

* **Versions never repeat.** A change is one write transaction that reads the row (``FOR UPDATE`` on
  PostgreSQL; ``BEGIN IMMEDIATE`` takes SQLite's write lock first), checks the expected version, and
  writes the row and its history entry together. A deleted experiment keeps its row with ``spec`` NULL
  (a tombstone), so creating it again goes on counting and a stale ``If-Match`` cannot match a new life.
* **A stale writer loses cleanly.** ``expected_version`` that is not the current one raises
  :class:`StaleVersion` before anything is written. Two creators of one new name race on the unique name:
  the loser's insert fails, is retried (:func:`registry.database.retrying`) and then sees the winner's row.
* **Writing the same spec again is not a change.** It returns the current record and adds no version, so
  gateways that seed the same config on every start leave no noise in the history.
* **A deadline ends a change, not a caller giving up.** With ``deadline_s`` the lock wait is bounded (SQLite's
  busy timeout, PostgreSQL's ``lock_timeout``) by the time left, and the deadline is checked again before
  COMMIT: past it the transaction is rolled back and :class:`WriteTimeout` raised, so a caller told "timed
  out" is told the truth. Only a PostgreSQL connection lost during COMMIT leaves the outcome open
  (:class:`OutcomeUnknown`).
* **Bounded.** Names are checked with :func:`check_experiment_name` (``fullmatch``, :data:`NAME_CHARACTERS`),
  a stored spec is at most :data:`MAX_SPEC_BYTES`, a registry holds at most :data:`MAX_EXPERIMENTS` live
  experiments.
* **Others hear of a change.** On PostgreSQL the transaction also sends ``NOTIFY depthprune_experiments``
  (delivered at commit); :class:`ChangeListener` wakes the gateways. Anyone can poll :meth:`versions`
  (one small ``SELECT`` of names and versions) instead; SQLite has no notifications.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from ground.core.errors import UserError
from registry.database import SQLITE_BUSY_TIMEOUT_MS, WRITE_OPTION, retrying
from registry.naming import check_name
from registry.tables import ExperimentChangeRow, ExperimentRow, utc, utc_now

CHANNEL = "depthprune_experiments"
"""PostgreSQL notification channel of experiment changes; the payload is the experiment's name."""
SEED, SET, DELETE = "seed", "set", "delete"
"""Actions of the history: created from a gateway's config file, set (created or changed), deleted."""
MAX_ACTOR_LENGTH = 256
MAX_REASON_LENGTH = 1024
NAME_CHARACTERS = "letters A-Z a-z, digits and . _ - + :"
"""What experiment names, arm names and every name a spec refers to are made of: visible ASCII that an HTTP
header value and a Prometheus label value carry as they are, and that a URL path carries unescaped."""
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+-]*")
"""Matched with ``fullmatch``: ``$`` would let a final newline through."""
MAX_NAME_LENGTH = 128
"""Longest experiment, arm, variant, objective or fallback name (the registry's variant names are as long)."""
MAX_ARMS = 16
"""Most arms in one experiment (and entries in ``forcible``)."""
MAX_EXPERIMENTS = 64
"""Most live experiments in one registry (deleted ones do not count): with :data:`MAX_ARMS` it bounds the
gateways' metric series per (experiment, arm)."""
MAX_SPEC_BYTES = 16_384
"""Largest spec the registry stores, as compact JSON (a spec at the other limits is about 6 KB)."""
WRITE_DEADLINE_S = 8.0
"""Default deadline of one change, lock waits and retries included: below the SQLite busy timeout, so a
change either commits within it or is rolled back and changes nothing."""

log = logging.getLogger("depthprune.registry")


class StaleVersion(UserError):
    """The change expected another version than the current one; nothing was written."""

    def __init__(self, name: str, expected: int, current: int):
        state = f"at version {current}" if current else "absent"
        super().__init__(
            f"experiment {name!r} is {state}, not version {expected}: someone changed it since you read it; "
            "nothing changed (read it again and retry)"
        )
        self.name, self.expected, self.current = name, expected, current


class TooManyExperiments(UserError):
    """Creating one more experiment would pass :data:`MAX_EXPERIMENTS`; nothing was written."""

    def __init__(self, name: str, live: int):
        super().__init__(
            f"experiment {name!r} would be the {live + 1}th: a registry holds at most {MAX_EXPERIMENTS} "
            "experiments (delete one first); nothing changed"
        )
        self.name = name


ROLLED_BACK = "the registry's write lock was not free in time; the change was rolled back"


class OutcomeUnknown(Exception):
    """The connection was lost during COMMIT (PostgreSQL): the change may or may not have been made."""


class WriteTimeout(Exception):
    """A change did not get the registry's write lock (or finish) within its deadline; it was rolled back
    and nothing changed."""


def check_spec_name(value: object, what: str) -> str:
    """``value`` if it can be an experiment, arm or referenced name, else a :class:`UserError` naming it.

    Args:
        value: the name.
        what: the field, for the message (``arms.0.name``).

    Returns:
        The name unchanged.
    """
    if not isinstance(value, str):
        raise UserError(f"{what} must be a string, got {type(value).__name__}")
    if not 1 <= len(value) <= MAX_NAME_LENGTH:
        raise UserError(f"{what} must be 1-{MAX_NAME_LENGTH} characters long, got {len(value)}")
    if not NAME_PATTERN.fullmatch(value):
        raise UserError(f"{what} {value!r} may hold only {NAME_CHARACTERS}, starting with a letter or digit")
    return value


def check_experiment_name(name: object) -> str:
    """``name`` if it can name an experiment (:func:`check_spec_name`, not all digits, not ``dense``).

    Raises:
        UserError: naming the problem.
    """
    check_spec_name(name, "experiment name")
    if name.casefold() == "dense":
        raise UserError(f"experiment {name!r} is reserved for the dense base model (in any case)")
    return check_name(name, "experiment")


class CaseClash(UserError):
    """A new experiment's name differs only by case from a live one's; nothing was written."""

    def __init__(self, name: str, existing: str):
        super().__init__(
            f"experiment {name!r} differs only by case from the experiment {existing!r}: names are told "
            "apart regardless of case; nothing changed"
        )
        self.name = name


def case_clash(name: str, live_names) -> str | None:
    """The live experiment whose name equals ``name`` but for case, if any."""
    return next(
        (other for other in live_names if other != name and other.casefold() == name.casefold()), None
    )


class ExperimentNotFound(UserError):
    """No experiment of that name (never created, or deleted)."""

    def __init__(self, name: str):
        super().__init__(f"no experiment named {name!r} in the registry")
        self.name = name


@dataclass(frozen=True)
class ExperimentRecord:
    """An experiment as the registry holds it now."""

    name: str
    spec: dict[str, Any] | None
    """The spec (arms, sticky, fallback, forcible); None once deleted."""
    version: int
    """Changes so far; the gateways' ``ETag``."""
    updated_by: str
    updated_at: datetime

    @property
    def deleted(self) -> bool:
        return self.spec is None


@dataclass(frozen=True)
class ExperimentChange:
    """One entry of an experiment's history."""

    experiment: str
    version: int
    """The version this change made."""
    action: str
    """``seed``, ``set`` or ``delete``."""
    actor: str
    """Who made it: ``config:<host>``, ``admin via gateway <addr>``, ``cli:<user>@<host>`` ..."""
    old_spec: dict[str, Any] | None
    new_spec: dict[str, Any] | None
    changed_at: datetime
    reason: str | None = None
    """Why, when the actor said (a guardrail gives the figures that made it act)."""


class ExperimentStore:
    """The experiments of one registry (SQLite or PostgreSQL)."""

    def __init__(self, registry):
        """
        Args:
            registry: an open :class:`registry.api.Registry`.
        """
        self.engine = registry.engine
        self.url = registry.url
        self.postgres = registry.engine.dialect.name == "postgresql"
        self._write_engine = registry.engine.execution_options(**{WRITE_OPTION: True})

    # ---------------------------------------------------------------- reading

    def versions(self) -> dict[str, int]:
        """``{name: version}`` of every experiment, deleted ones included: the cheap poll of the gateways."""
        with self.engine.connect() as connection:
            rows = connection.execute(select(ExperimentRow.name, ExperimentRow.version))
            return {name: version for name, version in rows}

    def records(self, names: list[str] | None = None, *, deleted: bool = False) -> list[ExperimentRecord]:
        """Experiments by name (all when ``names`` is None), without the deleted ones unless ``deleted``."""
        query = select(ExperimentRow).order_by(ExperimentRow.name)
        if names is not None:
            query = query.where(ExperimentRow.name.in_(names))
        with Session(self.engine) as session:
            found = [_record(row) for row in session.scalars(query)]
        return [record for record in found if deleted or not record.deleted]

    def get(self, name: str) -> ExperimentRecord:
        """The experiment of that name.

        Raises:
            ExperimentNotFound: none, or deleted.
        """
        found = self.records([name])
        if not found:
            raise ExperimentNotFound(name)
        return found[0]

    def history(self, name: str) -> list[ExperimentChange]:
        """Every change of ``name``, oldest first (empty when it never existed)."""
        query = (
            select(ExperimentChangeRow)
            .where(ExperimentChangeRow.experiment == name)
            .order_by(ExperimentChangeRow.version)
        )
        with Session(self.engine) as session:
            return [
                ExperimentChange(
                    experiment=row.experiment,
                    version=row.version,
                    action=row.action,
                    actor=row.actor,
                    old_spec=row.old_spec,
                    new_spec=row.new_spec,
                    changed_at=utc(row.changed_at),
                    reason=row.reason,
                )
                for row in session.scalars(query)
            ]

    def spec_at(self, name: str, version: int) -> dict[str, Any]:
        """The spec that version ``version`` of ``name`` set (for a rollback: set it again).

        Raises:
            UserError: no such version, or it was a deletion.
        """
        for change in self.history(name):
            if change.version == version:
                if change.new_spec is None:
                    raise UserError(f"version {version} of experiment {name!r} deleted it; it has no spec")
                return change.new_spec
        raise UserError(f"experiment {name!r} has no version {version}")

    # ---------------------------------------------------------------- writing

    def set(
        self,
        name: str,
        spec: dict[str, Any],
        *,
        actor: str,
        expected_version: int | None = None,
        deadline_s: float | None = None,
        reason: str | None = None,
    ) -> ExperimentRecord:
        """Create or replace an experiment's spec (the same spec again changes nothing).

        Args:
            name: the experiment.
            spec: its spec as JSON-ready data, already checked by the caller.
            actor: who changes it, for the history.
            expected_version: the version the change is based on (0: it must not exist yet); None writes
                whatever the current version is.
            deadline_s: seconds the whole change may take, lock waits and retries included; past it the
                transaction is rolled back and :class:`WriteTimeout` raised. None waits as long as the
                database's own timeouts and retries allow.
            reason: why, kept in the history (a guardrail's figures).

        Raises:
            StaleVersion: ``expected_version`` is not the current version; nothing was written.
            TooManyExperiments: it would be one experiment more than :data:`MAX_EXPERIMENTS`.
            WriteTimeout: the deadline passed; nothing was written.
        """
        check_experiment_name(name)
        return self._change(
            name,
            spec,
            actor=actor,
            action=SET,
            expected_version=expected_version,
            deadline_s=deadline_s,
            reason=reason,
        )

    def delete(
        self,
        name: str,
        *,
        actor: str,
        expected_version: int | None = None,
        deadline_s: float | None = None,
    ) -> ExperimentRecord:
        """Delete an experiment (its history stays; creating it again goes on counting versions).

        Raises:
            ExperimentNotFound: there is none to delete.
            StaleVersion: ``expected_version`` is not the current version; nothing was written.
            WriteTimeout: ``deadline_s`` passed (as for :meth:`set`); nothing was written.
        """
        return self._change(
            name, None, actor=actor, action=DELETE, expected_version=expected_version, deadline_s=deadline_s
        )

    def seed(
        self, name: str, spec: dict[str, Any], *, actor: str, deadline_s: float | None = None
    ) -> ExperimentRecord | None:
        """Create ``name`` from a gateway's config file, unless the registry already knows it.

        An experiment that exists (or was deleted) is the registry's to keep: a config file read at a
        restart must not undo what was changed at runtime.

        Returns:
            The new record, or None when the registry's was kept.
        """
        check_experiment_name(name)
        return self._change(
            name, spec, actor=actor, action=SEED, expected_version=None, only_new=True, deadline_s=deadline_s
        )

    def _change(
        self,
        name: str,
        spec: dict[str, Any] | None,
        *,
        actor: str,
        action: str,
        expected_version: int | None,
        only_new: bool = False,
        deadline_s: float | None = None,
        reason: str | None = None,
    ) -> ExperimentRecord | None:
        actor = actor[:MAX_ACTOR_LENGTH]
        if spec is not None:
            _check_size(name, spec)
        deadline = None if deadline_s is None else time.monotonic() + deadline_s

        def operation(session: Session) -> ExperimentRecord | None:
            query = select(ExperimentRow).where(ExperimentRow.name == name)
            row = session.scalars(query.with_for_update() if self.postgres else query).one_or_none()
            if only_new and row is not None:
                return None
            current = row.version if row is not None else 0
            if expected_version is not None and expected_version != current:
                raise StaleVersion(name, expected_version, current)
            old_spec = row.spec if row is not None else None
            if action == DELETE and old_spec is None:
                raise ExperimentNotFound(name)
            if row is not None and old_spec == spec:
                return _record(row)
            if old_spec is None and spec is not None:
                self._check_room(session, name)
                live = session.scalars(select(ExperimentRow.name).where(ExperimentRow.spec.is_not(None)))
                clash = case_clash(name, live)
                if clash is not None:
                    raise CaseClash(name, clash)
            if row is None:
                row = ExperimentRow(name=name)
                session.add(row)
            now = utc_now()
            row.spec, row.version, row.updated_by, row.updated_at = spec, current + 1, actor, now
            session.add(
                ExperimentChangeRow(
                    experiment=name,
                    version=current + 1,
                    action=action,
                    actor=actor,
                    old_spec=old_spec,
                    new_spec=spec,
                    changed_at=now,
                    reason=None if reason is None else reason[:MAX_REASON_LENGTH],
                )
            )
            if self.postgres:
                session.execute(text("SELECT pg_notify(:channel, :name)"), {"channel": CHANNEL, "name": name})
            session.flush()
            return _record(row)

        return retrying(lambda: self._transaction(operation, deadline))

    def _transaction(self, operation: Callable[[Session], Any], deadline: float | None) -> Any:
        """``operation`` in one write transaction whose lock waits end by ``deadline``; it commits only while
        the deadline has not passed, else rolls back and raises :class:`WriteTimeout`."""
        remaining_ms = _remaining_ms(deadline)
        with self._write_engine.connect() as connection:
            raw = connection.connection.dbapi_connection
            if not self.postgres and remaining_ms is not None:
                # Before BEGIN IMMEDIATE, which is where a held write lock makes us wait.
                raw.execute(f"PRAGMA busy_timeout = {remaining_ms}")
            try:
                with Session(bind=connection) as session:
                    session.begin()
                    if self.postgres and remaining_ms is not None:
                        # The lock wait ends first (retried, then WriteTimeout); the statement bound is
                        # for a server too slow to answer at all.
                        session.execute(text(f"SET LOCAL lock_timeout = {remaining_ms}"))
                        session.execute(text(f"SET LOCAL statement_timeout = {remaining_ms + 100}"))
                    result = operation(session)
                    _remaining_ms(deadline)  # the last moment to give up: before COMMIT
                    self._commit(session)
                    return result
            except DBAPIError:
                if deadline is not None and time.monotonic() >= deadline - 0.05:  # a timeout of ours
                    raise WriteTimeout(ROLLED_BACK) from None
                raise
            finally:
                if not self.postgres and remaining_ms is not None:
                    raw.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")

    def _commit(self, session: Session) -> None:
        """COMMIT; :class:`OutcomeUnknown` when PostgreSQL's connection broke during it (not retried: it may
        have committed). A failed SQLite COMMIT leaves the transaction open, and it is rolled back."""
        try:
            session.commit()
        except DBAPIError as error:
            if self.postgres and error.connection_invalidated:
                raise OutcomeUnknown(
                    "the registry's connection broke during COMMIT: the change may or may not have been "
                    "made; read the experiment's version before trying again"
                ) from None
            raise

    def _check_room(self, session: Session, name: str) -> None:
        """Raise :class:`TooManyExperiments` when ``name`` would be one live experiment too many."""
        if self.postgres:  # creations wait for each other, so two cannot both take the last place
            session.execute(text("SELECT pg_advisory_xact_lock(hashtext(:channel))"), {"channel": CHANNEL})
        live = session.scalar(select(func.count()).where(ExperimentRow.spec.is_not(None)))
        if live >= MAX_EXPERIMENTS:
            raise TooManyExperiments(name, live)


def _remaining_ms(deadline: float | None) -> int | None:
    """Milliseconds left before ``deadline`` (None: no deadline); :class:`WriteTimeout` when none are."""
    if deadline is None:
        return None
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise WriteTimeout(ROLLED_BACK)
    return max(1, int(remaining * 1000))


def _check_size(name: str, spec: dict[str, Any]) -> None:
    size = len(json.dumps(spec, separators=(",", ":")).encode())
    if size > MAX_SPEC_BYTES:
        raise UserError(
            f"experiment {name!r}: the spec is {size} bytes as JSON, more than the {MAX_SPEC_BYTES} a "
            "registry stores; nothing changed"
        )


def _record(row: ExperimentRow) -> ExperimentRecord:
    return ExperimentRecord(
        name=row.name,
        spec=row.spec,
        version=row.version,
        updated_by=row.updated_by,
        updated_at=utc(row.updated_at),
    )


class ChangeListener:
    """PostgreSQL ``LISTEN depthprune_experiments`` in a daemon thread: ``on_change(name)`` on each NOTIFY.

    A lost connection is opened again after ``retry_s``; meanwhile the gateways' polling covers. On SQLite
    :meth:`start` does nothing.
    """

    def __init__(self, store: ExperimentStore, on_change: Callable[[str], None], retry_s: float = 1.0):
        self.store, self.on_change, self.retry_s = store, on_change, retry_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.listening = threading.Event()
        """Set while a LISTEN connection is open (tests wait for it)."""

    def start(self) -> ChangeListener:
        if self.store.postgres and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="experiments-listen", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._listen()
            except Exception as error:  # any connection failure: wait, then listen again
                log.debug("experiment LISTEN connection lost: %s", error)
            self.listening.clear()
            self._stop.wait(self.retry_s)

    def _listen(self) -> None:
        raw = self.store.engine.raw_connection()
        try:
            connection = raw.driver_connection
            connection.autocommit = True
            connection.execute(f"LISTEN {CHANNEL}")
            self.listening.set()
            while not self._stop.is_set():
                for notice in connection.notifies(timeout=0.5, stop_after=1):
                    self.on_change(notice.payload)
        finally:
            raw.invalidate()  # a connection left in autocommit with a LISTEN must not go back to the pool
