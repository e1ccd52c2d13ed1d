"""Fixtures for the collector tests: captured sysfs roots, a fake clock, a private Kafka broker.

The project-wide fixtures (``shared_fixtures``, ``kafka_bootstrap``, ``kafka_topic``) come
from ``tests/conftest.py``; these add what only the collector needs.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from fakes import FakeClock

SCRIPTS = Path(__file__).resolve().parents[2] / "deploy" / "testservices"


@pytest.fixture(scope="session")
def h100_sysfs(shared_fixtures: Path) -> Path:
    """The captured /sys of a real H100 node (nine HCAs, RoCE hw_counters)."""
    return shared_fixtures / "infiniband" / "sysfs" / "gpud_h100_node" / "sys"


@pytest.fixture()
def fake_clock() -> FakeClock:
    """A hand-stepped clock."""
    return FakeClock()


class PrivateKafka:
    """A second, private broker run by ``deploy/testservices/kafka_up.sh`` on free ports.

    Tests may stop and restart it (``stop()`` / ``start()``) without touching the shared
    broker; its data directory survives a restart, like a real broker's.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port, self.controller_port = _free_port(), _free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.env = {**os.environ, "KAFKA_ROOT": str(root), "KAFKA_PORT": str(self.port),
                    "KAFKA_CONTROLLER_PORT": str(self.controller_port), "SKIP_APT": "1",
                    "KAFKA_HEAP_OPTS": "-Xms64m -Xmx256m"}

    def _script(self, name: str, *args: str) -> None:
        out = subprocess.run([str(SCRIPTS / name), *args], env=self.env, capture_output=True, text=True,
                             timeout=180)
        if out.returncode != 0:
            raise RuntimeError(f"{name} failed ({out.returncode}): {out.stderr[-2000:]}")

    def start(self) -> None:
        self._script("kafka_up.sh")

    def stop(self) -> None:
        self._script("kafka_down.sh")

    def purge(self) -> None:
        self._script("kafka_down.sh", "--purge")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def private_kafka(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateKafka]:
    """A broker of the module's own, purged afterwards; a test that stops it starts it again.

    It depends on ``kafka_bootstrap`` so it runs exactly where the shared test services do
    (Java and the Kafka jars are there; skipped locally / failing in CI otherwise).
    """
    if not (SCRIPTS / "kafka_up.sh").is_file():
        pytest.fail(f"{SCRIPTS / 'kafka_up.sh'} is missing")
    broker = PrivateKafka(tmp_path_factory.mktemp("kafka"))
    broker.start()
    try:
        yield broker
    finally:
        broker.purge()
