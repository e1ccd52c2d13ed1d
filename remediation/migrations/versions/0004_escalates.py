"""Escalations: an action that takes further a node gpuops already holds.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04

``actions.escalates`` is true when gpuops held the node when it took the action (a held
prediction's drain escalated to a reset, or a rule's certain evidence on a node held on a
prediction): the same incident going further, not a new take-out. The lemon limit counts
take-outs, so it skips escalations; a store restart reads the flag back rather than guess
from the order of records (a person's ``scontrol`` resume leaves no record). Rows written
before this revision read false: they count as take-outs, as they did (the safe side).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("actions") as batch:   # batch: SQLite cannot ALTER a column in place
        batch.add_column(sa.Column("escalates", sa.Boolean, nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("actions") as batch:
        batch.drop_column("escalates")
