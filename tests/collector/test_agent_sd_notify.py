"""The agent under systemd: READY, a WATCHDOG ping per tick and STOPPING, sent to a real AF_UNIX socket."""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import threading
from pathlib import Path

import pytest

from collector.agent import Agent
from collector.agent_settings import AgentSettings
from collector.sd_notify import Notifier
from fakes import CountingSource
from test_agent import FakeSink
from test_agent_cli import running_agent
from tests.helpers import wait_until


@pytest.fixture()
def systemd_socket():
    """A datagram socket in Linux's abstract namespace, as systemd's notify socket is: (address, socket)."""
    name = f"gpuops-test-notify-{os.getpid()}-{threading.get_ident()}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind("\0" + name)
    s.settimeout(5)
    yield "@" + name, s
    s.close()


def test_the_agent_says_ready_pings_the_watchdog_every_tick_and_says_stopping(systemd_socket) -> None:
    address, sock = systemd_socket
    sink = FakeSink()
    agent = Agent(AgentSettings(node="n1", interval_s=0.02, health_file=None, shutdown_flush_timeout_s=2),
                  [CountingSource()], sink)
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop, Notifier({"NOTIFY_SOCKET": address})))
    runner.start()
    try:
        wait_until(lambda: agent.ticks >= 4, timeout_s=10, message="four ticks")
    finally:
        stop.set()
        runner.join(timeout=10)
    got = []
    sock.settimeout(0.5)
    try:
        while True:
            got.append(sock.recv(256).decode())
    except TimeoutError:
        pass
    assert got[0] == "READY=1" and got[-1] == "STOPPING=1"
    assert got[1:-1] == ["WATCHDOG=1"] * agent.ticks  # one ping per tick, nothing else


def test_a_filesystem_notify_socket_works_and_no_socket_means_no_notification() -> None:
    with tempfile.TemporaryDirectory(dir="/tmp") as d:  # a short path: AF_UNIX paths stop at 108 bytes
        path = str(Path(d) / "notify")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind(path)
        try:
            assert Notifier({"NOTIFY_SOCKET": path}).notify("WATCHDOG=1")
            assert s.recv(64) == b"WATCHDOG=1"
        finally:
            s.close()
    assert not Notifier({}).notify("READY=1")


def test_a_notify_socket_that_is_gone_is_logged_once_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    n = Notifier({"NOTIFY_SOCKET": "/tmp/gpuops-no-such-notify-socket", "WATCHDOG_USEC": "120000000"})
    assert n.watchdog_s == 120.0
    with caplog.at_level(logging.WARNING, logger="collector.sd_notify"):
        assert not n.notify("WATCHDOG=1") and not n.notify("WATCHDOG=1")
    assert sum("cannot notify systemd" in r.getMessage() for r in caplog.records) == 1


def test_a_watchdog_shorter_than_three_intervals_is_warned_about(systemd_socket,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    address, _ = systemd_socket
    agent = Agent(AgentSettings(node="n1", interval_s=10.0, health_file=None, shutdown_flush_timeout_s=0),
                  [CountingSource()], FakeSink())
    stop = threading.Event()
    stop.set()  # one pass through start-up and shutdown
    with caplog.at_level(logging.WARNING, logger="collector.agent"):
        agent.run(stop, Notifier({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "20000000"}))
    assert "WatchdogSec (20 s) is under 3 intervals (30 s)" in caplog.text


def test_gpuops_agent_run_by_systemd_notifies_ready_watchdog_and_stopping(systemd_socket, h100_sysfs: Path) -> None:
    """The real CLI process, as the unit in deploy/slurm starts it (Type=notify), with $NOTIFY_SOCKET set."""
    import signal

    address, sock = systemd_socket
    with running_agent("--sink", "stdout", "--sources", "infiniband", "--sysfs-root", str(h100_sysfs),
                       "--interval", "0.2", "--node", "n1", "--health-file", "",
                       env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "120000000"}) as proc:
        sock.settimeout(30)
        assert sock.recv(64) == b"READY=1"
        assert [sock.recv(64) for _ in range(2)] == [b"WATCHDOG=1"] * 2
        proc.send_signal(signal.SIGTERM)
        while (msg := sock.recv(64)) == b"WATCHDOG=1":
            pass
        assert msg == b"STOPPING=1"
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr


def test_the_agent_unit_waits_for_ready_and_its_watchdog_spans_three_default_intervals() -> None:
    import re

    unit = (Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "gpuops-agent.service").read_text()
    assert re.search(r"^Type=notify$", unit, re.M) and re.search(r"^NotifyAccess=main$", unit, re.M)
    watchdog = re.search(r"^WatchdogSec=(\d+)$", unit, re.M)
    assert watchdog and int(watchdog.group(1)) >= 3 * AgentSettings.model_fields["interval_s"].default
