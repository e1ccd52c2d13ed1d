"""Silences: operators' declared quiet periods (nodes, a label selector or the fleet), audited.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-10

``scope`` is JSON text (``{"nodes": [...], "selector": {...}, "fleet": bool}``), ``mutes`` one
of actions/alerts/both, times float seconds since the epoch. A silence is never deleted: a
person's DELETE sets ``deleted_at``/``deleted_by``. ``silence_events`` is the audit trail
(created, deleted), like ``settings_events`` for settings.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "silences",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("scope", sa.Text, nullable=False),
        sa.Column("mutes", sa.String(16), nullable=False),
        sa.Column("starts_at", sa.Double, nullable=False),
        sa.Column("ends_at", sa.Double, nullable=False),
        sa.Column("author", sa.String(255), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("deleted_at", sa.Double, nullable=True),
        sa.Column("deleted_by", sa.String(255), nullable=True),
    )
    op.create_index("ix_silences_ends_at", "silences", ["ends_at"])
    op.create_table(
        "silence_events",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("silence_id", sa.String(64), nullable=False),
        sa.Column("at", sa.Double, nullable=False),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("note", sa.Text, nullable=False),
    )
    op.create_index("ix_silence_events_silence_id", "silence_events", ["silence_id"])


def downgrade() -> None:
    op.drop_index("ix_silence_events_silence_id", "silence_events")
    op.drop_table("silence_events")
    op.drop_index("ix_silences_ends_at", "silences")
    op.drop_table("silences")
