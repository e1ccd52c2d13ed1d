"""Verdicts: what a person found on a node gpuops took out on a prediction.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-06

``actions.verdict`` is ``healthy`` (the prediction was false) or ``faulty`` (it came true),
set through ``POST /v1/actions/{id}/verdict``. Each verdict counts towards the fleet's
false-action budget (remediation/budget.py); the leader reads them back from here, so a
verdict given on any replica, or before a restart, is not lost. Rows written before this
revision have none.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("actions") as batch:
        batch.add_column(sa.Column("verdict", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("actions") as batch:
        batch.drop_column("verdict")
