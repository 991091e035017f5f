"""Alembic environment of the registry.

The registry applies these migrations itself when it opens a database (``registry.schema.migrate``),
handing over its own connection in ``config.attributes["connection"]``. For writing a new revision by
hand: ``alembic -c registry/migrations/alembic.ini revision -m "what changed"`` (the URL is the
registry's default, ``DEPTHPRUNE_REGISTRY_URL`` or the SQLite file under ``DEPTHPRUNE_HOME``).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from registry.tables import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    """Print the SQL instead of running it (``alembic upgrade head --sql``)."""
    from ground.core.settings import default_registry_url

    context.configure(
        url=config.get_main_option("sqlalchemy.url") or default_registry_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run on the connection the registry passed in, or on a fresh one from the configured URL."""
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    from ground.core.settings import default_registry_url

    engine = create_engine(config.get_main_option("sqlalchemy.url") or default_registry_url())
    with engine.connect() as fresh:
        context.configure(connection=fresh, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
