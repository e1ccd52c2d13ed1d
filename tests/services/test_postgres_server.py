"""The PostgreSQL test server is the one the action store is built for (no mocks).

Checks what deploy/testservices/postgres_up.sh promises and the store's tests rely on:
PostgreSQL 15, UTF-8, reachable on 127.0.0.1 only, and a test may make and drop its own schema.
"""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

pytestmark = pytest.mark.postgres


def test_the_test_server_is_postgresql_15_in_utf8_on_loopback(postgres_url):
    engine = sa.create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW server_version_num").scalar().startswith("15")
            assert conn.exec_driver_sql("SHOW server_encoding").scalar() == "UTF8"
            assert conn.exec_driver_sql("SHOW listen_addresses").scalar() == "127.0.0.1"
            assert conn.exec_driver_sql("SELECT current_database()").scalar() == "gpuops"
    finally:
        engine.dispose()


def test_a_test_can_make_and_drop_its_own_schema(postgres_url):
    schema = f"probe_{uuid.uuid4().hex[:10]}"
    engine = sa.create_engine(postgres_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
            conn.exec_driver_sql(f'CREATE TABLE "{schema}".t (x int)')
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
            left = conn.exec_driver_sql(
                "SELECT count(*) FROM pg_namespace WHERE nspname = %(s)s", {"s": schema}).scalar()
        assert left == 0
    finally:
        engine.dispose()
