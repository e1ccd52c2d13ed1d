"""Small test helpers shared by every test package (polling with a deadline).

Tests never sleep a fixed time waiting for something to happen: they poll a predicate
until it holds or a deadline passes, so a fast machine is fast and a slow one still passes.
"""

from __future__ import annotations

import time
import uuid
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar
from urllib.parse import quote

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The predicate did not become true before the deadline (a test failure)."""


def wait_until(predicate: Callable[[], T], timeout_s: float, interval_s: float = 0.05,
               message: str | None = None) -> T:
    """Call ``predicate`` until it returns something truthy; return that value.

    ``timeout_s`` is the deadline in seconds from now (monotonic clock); ``interval_s`` the
    pause between calls. The predicate is always called at least once, and once more right
    at the deadline. Raises :class:`WaitTimeout` (an ``AssertionError``) naming the last
    value seen, so the failure message shows what the state was instead of ``False``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            what = message or getattr(predicate, "__name__", "condition")
            raise WaitTimeout(f"{what} not met within {timeout_s:g} s (last value: {value!r})")
        time.sleep(min(interval_s, max(0.0, deadline - time.monotonic())))


@contextmanager
def postgres_schema(base_url: str, prefix: str = "test") -> Iterator[str]:
    """A URL whose every connection sees only a fresh, empty schema of *base_url*'s database (dropped after).

    libpq's ``options=-csearch_path=...``: tests and benches get a clean store without a database each.
    """
    import sqlalchemy as sa

    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(base_url)
    with admin.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{base_url}{'&' if '?' in base_url else '?'}options={quote(f'-csearch_path={schema}')}"
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()
