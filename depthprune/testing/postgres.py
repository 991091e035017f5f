"""A throwaway PostgreSQL server for tests: ``initdb`` + ``pg_ctl`` from the installed server binaries.

Used by ``tests/test_registry.py`` (and any other test that wants the registry on PostgreSQL)::

    with TemporaryPostgres() as server:
        url = create_database_at(server.admin_url, "registry_test")

The cluster lives in a fresh temporary directory, listens on a free loopback port only, trusts local
connections, and is stopped and deleted on exit. PostgreSQL refuses to run as root, so as root the
binaries run as the ``postgres`` system user (``runuser``), which then owns the directory.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from depthprune.testing.servers import free_port

POSTGRES_BIN_GLOBS = (
    "/usr/lib/postgresql/*/bin",
    "/usr/local/pgsql/bin",
    "/opt/homebrew/opt/postgresql*/bin",
)
SYSTEM_USER = "postgres"


def find_postgres_bin() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl`` (newest version first), or ``None``."""
    candidates = []
    for pattern in POSTGRES_BIN_GLOBS:
        candidates.extend(sorted(glob.glob(pattern), reverse=True))
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    for candidate in candidates:
        directory = Path(candidate)
        if (directory / "initdb").is_file() and (directory / "pg_ctl").is_file():
            return directory
    return None


class TemporaryPostgres:
    """A PostgreSQL cluster that exists for the duration of a ``with`` block."""

    def __init__(self, bin_dir: Path | None = None):
        self.bin_dir = bin_dir or find_postgres_bin()
        """Directory of the server binaries."""
        if self.bin_dir is None:
            raise FileNotFoundError("no PostgreSQL server binaries (initdb, pg_ctl) found")
        self.port = 0
        """The port it listens on (set by :meth:`start`)."""
        self.root: Path | None = None
        self._as_root = os.geteuid() == 0

    @property
    def admin_url(self) -> str:
        """URL of the ``postgres`` database as superuser ``postgres``."""
        return f"postgresql+psycopg://{SYSTEM_USER}@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if self._as_root:
            command = ["runuser", "-u", SYSTEM_USER, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}")

    def start(self) -> TemporaryPostgres:
        """initdb, then start the server and wait until it accepts connections."""
        # Not under pytest's tmp dirs: those are private to root, and the server runs as `postgres`.
        self.root = Path(tempfile.mkdtemp(prefix="depthprune-pg-"))
        if self._as_root:
            shutil.chown(self.root, SYSTEM_USER, SYSTEM_USER)
        data = self.root / "data"
        self._run("initdb", "-D", str(data), "-U", SYSTEM_USER, "--auth=trust", "--no-sync", "-E", "UTF8")
        self.port = free_port()
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=60"
        )
        self._run(
            "pg_ctl", "-D", str(data), "-o", options, "-l", str(self.root / "server.log"), "-w", "start"
        )
        return self

    def stop(self) -> None:
        """Stop the server and delete its directory."""
        if self.root is None:
            return
        try:
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop")
        except (RuntimeError, subprocess.TimeoutExpired):
            pass  # already gone; deleting the directory is all that is left
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None

    def __enter__(self) -> TemporaryPostgres:
        try:
            return self.start()
        except BaseException:
            self.stop()  # a half-started cluster must not outlive the failed start
            raise

    def __exit__(self, *exc_info) -> None:
        self.stop()


def create_database_at(admin_url: str, name: str) -> str:
    """Create database ``name`` on the server of ``admin_url`` (any existing server) and return its URL."""
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(admin_url).set(drivername="postgresql+psycopg")
    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return url.set(database=name).render_as_string(hide_password=False)


def drop_database_at(admin_url: str, name: str) -> None:
    """Drop database ``name`` on the server of ``admin_url``, disconnecting whoever is still on it."""
    import psycopg
    from sqlalchemy.engine import make_url

    dsn = make_url(admin_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
