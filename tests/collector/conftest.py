"""Fixtures for the collector tests: captured sysfs roots, a fake clock, a private Kafka broker.

The project-wide fixtures (``shared_fixtures``, ``kafka_bootstrap``, ``kafka_topic``) come
from ``tests/conftest.py``; these add what only the collector needs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fakes import FakeClock


@pytest.fixture(scope="session")
def h100_sysfs(shared_fixtures: Path) -> Path:
    """The captured /sys of a real H100 node (nine HCAs, RoCE hw_counters)."""
    return shared_fixtures / "infiniband" / "sysfs" / "gpud_h100_node" / "sys"


@pytest.fixture()
def fake_clock() -> FakeClock:
    """A hand-stepped clock."""
    return FakeClock()
