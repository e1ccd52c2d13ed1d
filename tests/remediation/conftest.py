"""Fixtures of the remediation tests: the action store on each backend it supports.

``store_url`` is parametrized over ``sqlite`` (a fresh database file in the test's temp
directory) and ``postgres`` (a fresh schema in the real test server, dropped afterwards,
marked ``postgres``); ``store`` is an :class:`ActionStore` on it, migrated.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from remediation.store import ActionStore
from tests.helpers import postgres_schema


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """A URL of an empty database (not migrated) on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'actions.db'}"
    else:
        with postgres_schema(request.getfixturevalue("postgres_url")) as url:
            yield url


@pytest.fixture
def store(store_url: str) -> Iterator[ActionStore]:
    """A migrated store on each backend, closed afterwards."""
    s = ActionStore(store_url)
    s.migrate()
    yield s
    s.close()
