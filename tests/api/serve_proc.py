"""Run ``gpuops serve`` as a subprocess from a test (config, URL, token), with fresh Kafka topics and agents.

The process runs this checkout's code (``python -m api.cli serve``, from the repository root;
with a shared file-backed cluster, tests/api/serve_launcher.py). Its output goes to a log file
the test prints on failure.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

import yaml

from collector.simulator import SimConfig
from collector.simulator.live import LiveFleet
from collector.wire import encode_event
from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[2]


@dataclass
class ServeProcess:
    """One running ``serve``: its process, log, URL and admin token (when it printed one)."""

    proc: subprocess.Popen
    log: Path
    url: str = ""
    token: str = ""

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def terminate(self, timeout_s: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode


def start_serve(config: dict[str, Any], workdir: Path, name: str, env: dict[str, str] | None = None,
                timeout_s: float = 90.0) -> ServeProcess:
    """Write *config* and start ``serve`` on it; returns once it printed its URL."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg_path = workdir / f"{name}.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    log = workdir / f"{name}.log"
    shared_cluster = bool((env or {}).get("GPUOPS_TEST_CLUSTER_FILE"))
    cmd = ([sys.executable, "-m", "tests.api.serve_launcher", "--config", str(cfg_path)] if shared_cluster else
           [sys.executable, "-m", "api.cli", "serve", "--config", str(cfg_path)])
    full_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=full_env)
    sp = ServeProcess(proc, log)

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"serve {name} exited with {proc.returncode}:\n{sp.output()[-4000:]}")
        m = re.search(r"serving on (http://\S+)", sp.output())
        if m:
            sp.url = m.group(1)
            t = re.search(r"admin token: (\S+)", sp.output())
            sp.token = t.group(1) if t else ""
        return bool(m)

    wait_until(up, timeout_s=timeout_s, interval_s=0.2, message=f"serve {name} printed its URL")
    return sp


def make_topics(admin, names: list[str]) -> None:  # noqa: ANN001
    from kafka.admin import NewTopic

    admin.create_topics([NewTopic(n, num_partitions=4, replication_factor=1) for n in names], timeout_ms=30_000)

    def ready() -> bool:
        described = admin.describe_topics(names)
        return len(described) == len(names) and all(
            d.get("error_code") == 0 and len(d.get("partitions", [])) == 4 and
            all(p.get("leader", -1) >= 0 for p in d["partitions"]) for d in described)

    wait_until(ready, timeout_s=30, interval_s=0.1, message=f"topics {names} ready")


@pytest.fixture
def serve_topics(kafka_admin) -> Iterator[dict[str, str]]:  # noqa: ANN001
    tag = uuid.uuid4().hex[:8]
    t = {k: f"test.serve.{k}.{tag}" for k in ("telemetry", "events", "scores", "deadletter", "commands")}
    make_topics(kafka_admin, list(t.values()))
    yield t
    try:
        kafka_admin.delete_topics(list(t.values()), timeout_ms=30_000)
    except Exception:  # noqa: BLE001 - best effort; the broker's state is scratch
        pass


NODES = ("gpu-node-01", "gpu-node-02", "gpu-node-03", "gpu-node-04")


class Agents:
    """The simulated fleet publishing to real Kafka in a thread, as the nodes' agents would."""

    def __init__(self, bootstrap: str, topics: dict[str, str], speedup: float = 10.0) -> None:
        from kafka import KafkaProducer

        self.producer = KafkaProducer(bootstrap_servers=bootstrap.split(","), acks="all", linger_ms=5)
        cfg = SimConfig(nodes=len(NODES), names=NODES, hours=2, seed=101, rate_multiplier=0.0,
                        app_xid_per_node_day=0.0, reboot_per_node_day=0.0, congestion_per_day=0.0,
                        start_ts=float(int(time.time())))
        self.topics = topics
        self.fleet = LiveFleet(cfg, self.send, speedup=speedup, telemetry_topic=topics["telemetry"],
                               events_topic=topics["events"])
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.fleet.run, args=(self.stop,), daemon=True)

    def send(self, topic: str, key: str, value: bytes) -> None:
        self.producer.send(topic, key=key.encode(), value=value)

    def start(self) -> "Agents":
        self.thread.start()
        return self

    def inject_xid(self, node: str, gpu: int, code: int) -> float:
        ts = self.fleet.now()
        self.send(self.topics["events"], node, encode_event({
            "ts": ts, "node": node, "gpu": gpu, "source": "kmsg", "kind": "xid", "code": code,
            "message": f"NVRM: Xid (PCI:0000:{gpu:02x}:00): {code}, pid=4242, name=python3, NVLink error"}))
        self.producer.flush()
        return ts

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.producer.flush()
        self.producer.close()
