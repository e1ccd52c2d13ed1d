"""The action store's first schema: actions and their audit events, node scores, settings.

Revision ID: 0001
Revises:
Create Date: 2026-12-03

Times are float seconds since the epoch (double precision); evidence, results and setting
values are JSON text, enums their string values. The tables are written out here, not
imported from ``remediation/store.py``: a migration is frozen once shipped.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "actions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("node", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("incident_ts", sa.Double, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
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
    )
    op.create_index("ix_actions_node", "actions", ["node"])
    op.create_index("ix_actions_state", "actions", ["state"])
    op.create_index("ix_actions_created_at", "actions", ["created_at"])
    op.create_table(
        "action_events",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("action_id", sa.String(64), sa.ForeignKey("actions.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("at", sa.Double, nullable=False),
        sa.Column("from_state", sa.String(32), nullable=True),
        sa.Column("to_state", sa.String(32), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("note", sa.Text, nullable=False),
    )
    op.create_index("ix_action_events_action_id", "action_events", ["action_id"])
    op.create_table(
        "node_scores",
        sa.Column("node", sa.String(255), primary_key=True),
        sa.Column("ts", sa.Double, nullable=False),
        sa.Column("risk", sa.Double, nullable=False),
        sa.Column("fault", sa.String(255), nullable=True),
        sa.Column("anomaly", sa.Double, nullable=False),
        sa.Column("rule", sa.String(255), nullable=True),
        sa.Column("state", sa.String(32), nullable=False),
    )
    op.create_table(
        "settings",
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
    )
    op.create_table(
        "settings_events",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("at", sa.Double, nullable=False),
        sa.Column("value", sa.Text, nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("note", sa.Text, nullable=False),
    )
    op.create_index("ix_settings_events_key", "settings_events", ["key"])


def downgrade() -> None:
    op.drop_table("settings_events")
    op.drop_table("settings")
    op.drop_table("node_scores")
    op.drop_table("action_events")
    op.drop_table("actions")
