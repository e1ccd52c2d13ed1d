"""Leases: which replica leads (runs the remediation engine), until when, in which term.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03

One row per lease name (``engine``). ``holder`` is the replica that holds it, ``expires_at``
the wall time (float s since the epoch) after which another replica may take it, and
``epoch`` the fencing token: it grows by one each time the lease changes hands (or is taken
again after lapsing), so a deposed leader's term is told apart from the current one.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("expires_at", sa.Double, nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("acquired_at", sa.Double, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("leases")
