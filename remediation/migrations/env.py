"""Alembic environment of the action store: runs online on the connection the store hands over.

``ActionStore.migrate`` puts an open connection (inside its transaction) into
``config.attributes["connection"]``; there is no offline (SQL script) mode and no
``alembic.ini``. SQLite gets batch mode, so later migrations can alter tables there.
"""

from __future__ import annotations

from alembic import context

from remediation.store import VERSION_TABLE

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("the action store's migrations run through ActionStore(url).migrate(), "
                       "which passes its connection; there is no alembic.ini to run them from the CLI")

context.configure(connection=connection, target_metadata=None, version_table=VERSION_TABLE,
                  render_as_batch=connection.dialect.name == "sqlite", transactional_ddl=True)
with context.begin_transaction():
    context.run_migrations()
