"""Connecting to the registry database: SQLite tuned for several writers, PostgreSQL by URL, and retries.

SQLite is the embedded default. Several prune processes may register into one file at once, so every
connection uses WAL (readers never block the writer), a busy timeout, and write transactions that start
with ``BEGIN IMMEDIATE``: a transaction that reads first and upgrades to a write later can fail at once
with "database is locked" instead of waiting, which the immediate lock avoids. What still fails
transiently (a lock held longer than the timeout, a PostgreSQL serialization failure, two processes
inserting the same new row) is retried by :func:`retrying`.

A SQLite file is checked with ``PRAGMA quick_check`` when it is opened: a damaged file (a bad sector, a
copy taken mid-write) is refused with one line naming it, before anything reads or writes it. Writing into
a damaged b-tree can spread the damage; refusing keeps the file as it was for ``.recover``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, NoSuchModuleError, OperationalError

from ground.core.errors import UserError

SQLITE_BUSY_TIMEOUT_MS = 30_000
POSTGRES_CONNECT_TIMEOUT_S = 5
WRITE_OPTION = "registry_write"
"""Execution option that marks a connection's transactions as writes (``BEGIN IMMEDIATE`` on SQLite)."""

Result = TypeVar("Result")


def display_url(url: str) -> str:
    """The URL with its password hidden, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection, _record) -> None:
        # Transactions are begun by the "begin" hook below, not by the sqlite3 module's own guesswork.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(connection) -> None:
        immediate = connection.get_execution_options().get(WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def create_registry_engine(url: str) -> Engine:
    """An engine for ``url`` whose connection was tried once, so a wrong URL fails here.

    Args:
        url: SQLAlchemy URL: ``sqlite:///path/registry.db`` or ``postgresql+psycopg://user@host/db``.

    Returns:
        The engine.

    Raises:
        UserError: when the URL is malformed, names a driver that is not installed, or does not connect.
    """
    shown = display_url(url)
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise UserError(
            f"registry URL {url!r} is not a database URL (e.g. sqlite:///registry.db or "
            "postgresql+psycopg://user@host/db)"
        ) from None
    connect_args: dict = {}
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        database = parsed.database
        if database and database != ":memory:" and not database.startswith("file:"):
            try:
                Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise UserError(f"cannot create the registry's directory for {shown}: {error}") from None
        connect_args["timeout"] = SQLITE_BUSY_TIMEOUT_MS / 1000
    elif backend == "postgresql":
        if parsed.get_driver_name() in ("psycopg", "psycopg2"):
            connect_args["connect_timeout"] = POSTGRES_CONNECT_TIMEOUT_S
        if parsed.drivername == "postgresql":
            # Plain postgresql:// would pick psycopg2, which is not a dependency; psycopg 3 is.
            parsed = parsed.set(drivername="postgresql+psycopg")
    try:
        engine = create_engine(parsed, connect_args=connect_args, pool_pre_ping=backend != "sqlite")
    except (NoSuchModuleError, ModuleNotFoundError, ImportError) as error:
        raise UserError(f"registry URL {shown}: database driver not available ({error})") from None
    except ArgumentError as error:
        raise UserError(f"registry URL {shown} is not usable: {error}") from None
    if backend == "sqlite":
        _configure_sqlite(engine)

    def check_connection() -> None:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
            if backend == "sqlite":
                check_sqlite_integrity(connection, parsed.database or shown)

    try:
        # Two processes opening one SQLite file at the same moment can see a transient "database is
        # locked" here, which the busy timeout does not always absorb (seen with two `prune` runs started
        # together on a new file): it is retried like any transient failure.
        retrying(check_connection)
    except DBAPIError as error:
        engine.dispose()
        reason = str(error.orig).strip().splitlines()[0] if error.orig else str(error)
        if backend == "sqlite" and "malformed" in reason:
            raise UserError(damaged_registry_message(parsed.database or shown, reason)) from None
        raise UserError(f"cannot connect to the registry at {shown}: {reason}") from None
    except UserError:
        engine.dispose()
        raise
    return engine


def check_sqlite_integrity(connection, database: str) -> None:
    """Refuse a damaged SQLite file: ``PRAGMA quick_check`` must answer ``ok``.

    quick_check reads every page of a registry-sized file in milliseconds (it skips the index-content
    comparison of ``integrity_check``), so it runs on every open.

    Raises:
        UserError: one line naming the file and the first problem found.
    """
    problems = [row[0] for row in connection.exec_driver_sql("PRAGMA quick_check").fetchall()]
    if problems != ["ok"]:
        raise UserError(damaged_registry_message(database, problems[0] if problems else "no answer"))


def damaged_registry_message(database: str, problem: str) -> str:
    """The one-line refusal of a damaged SQLite registry, with the way out."""
    return (
        f"the registry {database} is damaged ({problem.strip().splitlines()[0]}); nothing was read or "
        f"written. Restore a backup, or salvage it: sqlite3 {database} .recover | sqlite3 repaired.db"
    )


def is_transient(error: Exception) -> bool:
    """Whether ``error`` is worth another try: a lock, a busy database, a serialization failure."""
    if isinstance(error, IntegrityError):
        # Another process inserted the same new row first; the retry finds and updates it. Other
        # integrity errors (a missing value) are bugs that no retry fixes.
        message = str(error.orig).lower()
        return "unique" in message or "duplicate key" in message
    if isinstance(error, OperationalError):
        message = str(error.orig).lower()
        return any(word in message for word in ("locked", "busy", "deadlock", "serializ", "could not obtain"))
    if isinstance(error, DBAPIError):
        code = getattr(error.orig, "sqlstate", None) or getattr(error.orig, "pgcode", None)
        return code in ("40001", "40P01", "55P03")  # serialization failure, deadlock, lock not available
    return False


def retrying(operation: Callable[[], Result], *, attempts: int = 12, first_delay_s: float = 0.05) -> Result:
    """Run ``operation`` (one whole transaction), again after transient failures, with jittered backoff.

    Args:
        operation: a function that opens, runs and commits one transaction.
        attempts: how many times to try before giving up.
        first_delay_s: wait before the second try; it doubles each time (capped at 2 s).

    Returns:
        What ``operation`` returned.
    """
    delay = first_delay_s
    for attempt in range(1, attempts + 1):
        try:
            return operation()
        except DBAPIError as error:
            if attempt == attempts or not is_transient(error):
                raise
        time.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, 2.0)
    raise AssertionError("unreachable")
