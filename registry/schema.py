"""Creating and upgrading the registry schema with the Alembic migrations shipped in this package.

:func:`migrate` runs on every :func:`registry.open_registry`. When the database is already at
:data:`HEAD_REVISION` it only reads one row and never imports Alembic (half a second saved on every
command). Upgrades hold a lock (SQLite's write lock, a PostgreSQL advisory lock) so that several
processes opening a fresh database at once migrate it exactly once.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, inspect, text

from registry.database import WRITE_OPTION

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
HEAD_REVISION = "0007"
"""The newest revision in ``migrations/versions``; a test keeps it equal to Alembic's head."""
POSTGRES_MIGRATION_LOCK = 5_480_211_730  # any constant; names the advisory lock of registry migrations


def alembic_config():
    """An Alembic configuration pointing at the packaged migrations (no ini file needed)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def head_revision() -> str:
    """The newest migration revision according to Alembic."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (``None`` for an empty database)."""
    with engine.connect() as connection:
        if not inspect(connection).has_table("alembic_version"):
            return None
        return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()


def migrate(engine: Engine) -> None:
    """Bring the database to the newest revision (creating the tables in an empty one)."""
    if current_revision(engine) == HEAD_REVISION:
        return
    from alembic import command
    from alembic.runtime.migration import MigrationContext
    from alembic.util import CommandError

    from ground.core.errors import UserError

    config = alembic_config()
    with engine.connect().execution_options(**{WRITE_OPTION: True}) as connection:
        with connection.begin():
            if engine.dialect.name == "postgresql":
                connection.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": POSTGRES_MIGRATION_LOCK}
                )
            # Another process may have migrated while this one waited for the lock.
            found = MigrationContext.configure(connection).get_current_revision()
            if found == HEAD_REVISION:
                return
            config.attributes["connection"] = connection
            try:
                command.upgrade(config, "head")
            except CommandError as error:
                raise UserError(
                    f"the registry's schema is at revision {found!r}, which this depthprune does not know "
                    f"(newest known: {HEAD_REVISION}); upgrade depthprune ({error})"
                ) from None
