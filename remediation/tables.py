"""The action store's tables as SQLAlchemy Core objects, for queries.

The Alembic migrations in ``remediation/migrations/`` own the schema; these mirror revision
head (``tests/remediation/test_store.py`` checks that migrating an empty database gives
exactly :data:`METADATA`). :mod:`remediation.store` is the only reader.
"""

from __future__ import annotations

import sqlalchemy as sa

_md = sa.MetaData()
actions = sa.Table(
    "actions", _md,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("node", sa.String(255), nullable=False, index=True),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("state", sa.String(32), nullable=False, index=True),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("actor", sa.String(255), nullable=False),
    sa.Column("incident_ts", sa.Double, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False, index=True),
    sa.Column("updated_at", sa.Double, nullable=False),
    sa.Column("gpu", sa.Integer, nullable=True),
    sa.Column("fault", sa.String(255), nullable=True),
    sa.Column("grade", sa.String(64), nullable=True),
    sa.Column("source", sa.String(64), nullable=True),
    sa.Column("score", sa.Double, nullable=True),
    sa.Column("evidence", sa.Text, nullable=False),
    sa.Column("dry_run", sa.Boolean, nullable=False),
    sa.Column("adapter", sa.String(64), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("result", sa.Text, nullable=False),
    sa.Column("blocked_by", sa.Text, nullable=True),
    sa.Column("escalates", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("verdict", sa.String(16), nullable=True),
)
action_events = sa.Table(
    "action_events", _md,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("action_id", sa.String(64), sa.ForeignKey("actions.id", ondelete="CASCADE"),
              nullable=False, index=True),
    sa.Column("at", sa.Double, nullable=False),
    sa.Column("from_state", sa.String(32), nullable=True),
    sa.Column("to_state", sa.String(32), nullable=False),
    sa.Column("actor", sa.String(255), nullable=False),
    sa.Column("note", sa.Text, nullable=False),
)
node_scores = sa.Table(
    "node_scores", _md,
    sa.Column("node", sa.String(255), primary_key=True),
    sa.Column("ts", sa.Double, nullable=False),
    sa.Column("risk", sa.Double, nullable=False),
    sa.Column("fault", sa.String(255), nullable=True),
    sa.Column("anomaly", sa.Double, nullable=False),
    sa.Column("rule", sa.String(255), nullable=True),
    sa.Column("state", sa.String(32), nullable=False),
)
settings = sa.Table(
    "settings", _md,
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("updated_at", sa.Double, nullable=False),
    sa.Column("actor", sa.String(255), nullable=False),
)
settings_events = sa.Table(
    "settings_events", _md,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("key", sa.String(255), nullable=False, index=True),
    sa.Column("at", sa.Double, nullable=False),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("actor", sa.String(255), nullable=False),
    sa.Column("note", sa.Text, nullable=False),
)
leases = sa.Table(
    "leases", _md,
    sa.Column("name", sa.String(255), primary_key=True),
    sa.Column("holder", sa.String(255), nullable=False),
    sa.Column("expires_at", sa.Double, nullable=False),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("acquired_at", sa.Double, nullable=False),
)
silences = sa.Table(
    "silences", _md,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("scope", sa.Text, nullable=False),
    sa.Column("mutes", sa.String(16), nullable=False),
    sa.Column("starts_at", sa.Double, nullable=False),
    sa.Column("ends_at", sa.Double, nullable=False, index=True),
    sa.Column("author", sa.String(255), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("deleted_at", sa.Double, nullable=True),
    sa.Column("deleted_by", sa.String(255), nullable=True),
)
silence_events = sa.Table(
    "silence_events", _md,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("silence_id", sa.String(64), nullable=False, index=True),
    sa.Column("at", sa.Double, nullable=False),
    sa.Column("event", sa.String(32), nullable=False),
    sa.Column("actor", sa.String(255), nullable=False),
    sa.Column("note", sa.Text, nullable=False),
)
#: the tables' metadata at migration head (a test checks the migrations produce exactly this)
METADATA = _md
