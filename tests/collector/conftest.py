"""Fixtures for the collector tests: the shared real captures, fake NVML, a private Kafka broker.

Names are prefixed ``collector_`` so they never clash with the project-wide fixtures of
``tests/conftest.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _missing(what: str) -> None:
    """Skip locally, fail in CI (shared/DESIGN.md, "Test services")."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what} (required in CI)")
    pytest.skip(what)


@pytest.fixture(scope="session")
def collector_fixtures() -> Path:
    """Path to ../shared/fixtures (override with GPUOPS_SHARED_FIXTURES)."""
    root = Path(os.environ.get("GPUOPS_SHARED_FIXTURES", REPO.parent / "shared" / "fixtures"))
    if not root.is_dir():
        _missing(f"shared fixtures not found at {root}; set GPUOPS_SHARED_FIXTURES")
    return root


@pytest.fixture(scope="session")
def h100_sysfs(collector_fixtures: Path) -> Path:
    """The captured /sys of a real H100 node (nine HCAs, RoCE hw_counters)."""
    return collector_fixtures / "infiniband" / "sysfs" / "gpud_h100_node" / "sys"
