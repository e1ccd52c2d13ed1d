"""Fixtures of the remediation tests: the action store on each backend it supports.

``store_url`` is parametrized over ``sqlite`` (a fresh database file in the test's temp
directory) and ``postgres`` (a fresh schema in the real test server, dropped afterwards,
marked ``postgres``); ``store`` is an :class:`ActionStore` on it, migrated.
"""

from __future__ import annotations

import uuid
from typing import Iterator
from urllib.parse import quote

import pytest

from remediation.store import ActionStore


def _postgres_schema_url(request: pytest.FixtureRequest) -> Iterator[str]:
    import sqlalchemy as sa

    base = request.getfixturevalue("postgres_url")
    schema = f"test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(base)
    with admin.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in base else "?"
    try:
        # libpq's `options`: every connection of the store sees only this schema
        yield f"{base}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """A URL of an empty database (not migrated) on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'actions.db'}"
    else:
        yield from _postgres_schema_url(request)


@pytest.fixture
def store(store_url: str) -> Iterator[ActionStore]:
    """A migrated store on each backend, closed afterwards."""
    s = ActionStore(store_url)
    s.migrate()
    yield s
    s.close()
