"""The agent carrying out commands: what it resets, what it refuses and says so, and that it never raises."""

from __future__ import annotations

import logging
import random
import subprocess
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from collector.agent import Agent
from collector.agent_settings import AgentSettings
from collector.command_handler import CommandHandler
from collector.command_loop import CommandLoop, attach_commands, command_group
from collector.commands import Command, CommandKeyError, CommandResult, ResultStatus, result_from_event, sign
from collector.gpu_reset import GpuOpsError, NvmlGpuOps, reset_gpu
from fake_nvml import FakeGpu, FakeNvml
from fakes import CountingSource, FakeClock
from test_agent import FakeSink
from tests.helpers import wait_until

KEY = b"s" * 32
NODE = "gpu-node-001"
T0 = FakeClock().time()


def _command(**kw) -> Command:
    base = dict(id="act-0001", verb="gpu_reset", node=NODE, gpu=1, issued_at=T0, expires_at=T0 + 300,
                nonce="00112233445566778899aabbccddeeff", reason="gpuops: pending row remap")
    return Command(**{**base, **kw})


class Node:
    """A fake GPU node: fake NVML with four GPUs, a handler on it, and the results it published."""

    def __init__(self, clock: FakeClock) -> None:
        self.nvml = FakeNvml([FakeGpu(pci_bus_id=f"00000000:{0x18 + i:02x}:00.0") for i in range(4)])
        self.results: list[CommandResult] = []
        self.handler = CommandHandler(NODE, KEY, NvmlGpuOps(self.nvml, run=self.nvml.nvidia_smi), clock,
                                      self.results.append)


@pytest.fixture()
def node(fake_clock: FakeClock) -> Node:
    return Node(fake_clock)


def test_an_idle_gpu_is_reset_and_the_success_published(node: Node) -> None:
    result = node.handler.handle(sign(_command(), KEY))
    assert result is not None and result.status is ResultStatus.SUCCEEDED and result.command_id == "act-0001"
    assert node.nvml.resets == {1: 1} and node.results == [result]
    assert node.handler.stats()["outcomes"] == {"succeeded": 1}


def test_a_busy_gpu_is_not_reset_and_the_result_says_busy(node: Node) -> None:
    node.nvml.gpus[1].processes = [4242, 4343]
    result = node.handler.handle(sign(_command(), KEY))
    assert result.status is ResultStatus.FAILED and result.code == "busy" and "4242" in result.detail
    assert not node.nvml.resets and node.nvml.calls.get("nvidia-smi") is None


def test_a_reset_nvidia_smi_refuses_fails_with_its_words(node: Node) -> None:
    node.handler.gpu_ops = NvmlGpuOps(node.nvml, run=lambda argv, **kw: subprocess.CompletedProcess(
        argv, 255, "", "Unable to reset this GPU because it's being used by some other process"))
    result = node.handler.handle(sign(_command(), KEY))
    assert result.status is ResultStatus.FAILED and result.code == "reset_failed" and "being used" in result.detail


def test_an_nvml_error_listing_processes_fails_the_command_not_the_agent(node: Node) -> None:
    node.nvml.gpus[1].failing["nvmlDeviceGetComputeRunningProcesses"] = 15  # NVML_ERROR_GPU_IS_LOST
    result = node.handler.handle(sign(_command(), KEY))
    assert result.status is ResultStatus.FAILED and result.code == "gpu_check_failed" and not node.nvml.resets


def test_nvml_that_does_not_answer_fails_the_command_and_the_next_ones_at_once_until_it_returns(
        node: Node) -> None:
    release = threading.Event()
    listing = node.nvml.nvmlDeviceGetComputeRunningProcesses

    def hung(handle):  # NVML on a node whose GPU fell off the bus
        release.wait()
        return listing(handle)

    node.nvml.nvmlDeviceGetComputeRunningProcesses = hung
    node.handler.gpu_ops = NvmlGpuOps(node.nvml, run=node.nvml.nvidia_smi, nvml_timeout_s=0.05)
    try:
        first = node.handler.handle(sign(_command(id="act-0001", nonce="0" * 32), KEY))
        second = node.handler.handle(sign(_command(id="act-0002", nonce="1" * 32), KEY))
    finally:
        release.set()
    assert first.status is ResultStatus.FAILED and first.code == "gpu_check_failed"
    assert "NVML did not answer within 0.05 s" in first.detail
    # the NVML thread is still in the first call: the second is refused at once, the loop goes on
    assert second.status is ResultStatus.FAILED and "has not answered an earlier call" in second.detail
    assert not node.nvml.resets
    node.nvml.nvmlDeviceGetComputeRunningProcesses = listing
    wait_until(lambda: node.handler.gpu_ops._calls.returned, timeout_s=5)  # the hung call came back
    third = node.handler.handle(sign(_command(id="act-0003", nonce="2" * 32), KEY))
    assert third.status is ResultStatus.SUCCEEDED and node.nvml.resets == {1: 1}


@pytest.mark.parametrize("make, reason, answered", [
    (lambda: sign(_command(), b"f" * 32), "bad_signature", False),
    (lambda: sign(_command(), KEY).replace(b',"sig"', b',"nosig"'), "unsigned", False),
    (lambda: sign(_command(issued_at=T0 - 600, expires_at=T0 - 300), KEY), "expired", True),
    (lambda: sign(_command(issued_at=T0 + 600, expires_at=T0 + 900), KEY), "not_yet_valid", True),
    (lambda: sign(_command(node="gpu-node-002"), KEY), "foreign_node", False),
    (lambda: sign(_command(verb="reboot"), KEY), "unknown_verb", True),
    (lambda: sign(_command(gpu=4), KEY), "bad_gpu", True),
    (lambda: b'{"schema": "gpuops.command", "v": 1, "body": "' + b"x" * 5000 + b'"}', "malformed", False),
])
def test_each_refused_command_is_logged_with_its_reason_and_answered_only_when_signed(
        node: Node, caplog: pytest.LogCaptureFixture, make, reason: str, answered: bool) -> None:
    with caplog.at_level(logging.WARNING, logger="collector.command_handler"):
        result = node.handler.handle(make())
    assert not node.nvml.resets
    assert f"command rejected ({reason}" in caplog.text
    assert node.handler.stats()["outcomes"] == {f"rejected:{reason}": 1}
    if answered:
        assert result is not None and result.status is ResultStatus.REJECTED and result.code == reason
        assert node.results == [result] and result.command_id == "act-0001"
    else:
        assert result is None and node.results == []


def test_a_replayed_command_is_refused_logged_and_not_answered_twice(node: Node,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    raw = sign(_command(), KEY)
    node.handler.handle(raw)
    with caplog.at_level(logging.WARNING, logger="collector.command_handler"):
        assert node.handler.handle(raw) is None
    assert "command rejected (replayed" in caplog.text
    assert node.nvml.resets == {1: 1} and len(node.results) == 1


def test_the_handler_never_raises_on_random_bytes(node: Node) -> None:
    rng = random.Random(20260101)
    good = sign(_command(), KEY)
    logging.getLogger("collector.command_handler").setLevel(logging.ERROR)
    try:
        for i in range(3000):
            if i % 3 == 0:
                raw = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 600)))
            else:
                raw = bytearray(good)
                for _ in range(rng.randint(1, 8)):
                    raw[rng.randrange(len(raw))] = rng.randrange(256)
                raw = bytes(raw)
            node.handler.handle(raw)
    finally:
        logging.getLogger("collector.command_handler").setLevel(logging.NOTSET)
    assert "error" not in node.handler.outcomes and sum(node.nvml.resets.values()) <= 1


def test_a_publish_failure_is_logged_and_the_outcome_stands(node: Node, caplog: pytest.LogCaptureFixture) -> None:
    def broken(_: CommandResult) -> None:
        raise OSError("buffer gone")

    node.handler.publish_result = broken
    result = node.handler.handle(sign(_command(), KEY))
    assert result.status is ResultStatus.SUCCEEDED and "could not queue the result" in caplog.text


# ---------------------------------------------------------------- the real reset function


def test_reset_gpu_runs_nvidia_smi_with_the_index_and_reports_its_failure(tmp_path: Path) -> None:
    log = tmp_path / "argv"
    tool = tmp_path / "nvidia-smi"
    tool.write_text(f'#!/bin/sh\necho "$@" >> {log}\n[ "$3" = 0 ] && exit 0\necho "GPU in use" >&2\nexit 255\n')
    tool.chmod(0o755)
    reset_gpu(0, nvidia_smi=str(tool))
    with pytest.raises(GpuOpsError, match="exited 255: GPU in use"):
        reset_gpu(2, nvidia_smi=str(tool))
    assert log.read_text().splitlines() == ["--gpu-reset -i 0", "--gpu-reset -i 2"]


def test_reset_gpu_bounds_a_hung_nvidia_smi_and_a_missing_one(tmp_path: Path) -> None:
    def hung(argv, **kw):
        raise subprocess.TimeoutExpired(argv, kw["timeout"])

    with pytest.raises(GpuOpsError, match="did not finish within 1 s"):
        reset_gpu(0, timeout_s=1, run=hung)
    with pytest.raises(GpuOpsError, match="cannot run"):
        reset_gpu(0, nvidia_smi=str(tmp_path / "absent"))
    with pytest.raises(GpuOpsError, match="non-negative int"):
        reset_gpu("0; reboot")  # type: ignore[arg-type]


# ---------------------------------------------------------------- the consumer loop and the agent


class FakeConsumer:
    """Our own CommandConsumer boundary: serves prepared batches, records commits."""

    def __init__(self, batches: list) -> None:
        self.batches = batches
        self.commits = 0
        self.closed = False

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict:
        if not self.batches:
            return {}
        item = self.batches.pop(0)
        if isinstance(item, Exception):
            raise item
        return {("gpu.commands", 0): [SimpleNamespace(key=k, value=v) for k, v in item]}

    def commit(self, timeout_ms: int | None = None) -> None:
        assert timeout_ms is not None, "a commit must not wait on the broker without bound"
        self.commits += 1

    def close(self, timeout_ms: int | None = None) -> None:
        assert timeout_ms is not None, "a close must not wait on the broker without bound"
        self.closed = True


def test_the_loop_handles_its_node_skips_others_by_key_and_commits_after_handling(node: Node) -> None:
    consumer = FakeConsumer([[(b"gpu-node-002", b"whatever"), (NODE.encode(), b"junk"),
                              (NODE.encode(), sign(_command(), KEY))]])
    loop = CommandLoop(NODE, node.handler, lambda: consumer)
    assert loop.poll_once() == 2 and consumer.commits == 1
    assert loop.skipped_other_nodes == 1 and node.nvml.resets == {1: 1}
    assert loop.poll_once() == 0 and consumer.commits == 1


def test_the_loop_survives_a_failing_consumer_and_stops_on_the_event(node: Node) -> None:
    stop = threading.Event()
    consumers = [FakeConsumer([RuntimeError("broker gone")]),
                 FakeConsumer([[(NODE.encode(), sign(_command(), KEY))]])]
    made: list[FakeConsumer] = []

    def factory() -> FakeConsumer:
        made.append(consumers.pop(0))
        return made[-1]

    loop = CommandLoop(NODE, node.handler, factory, poll_timeout_s=0.01)
    loop.backoff.initial_s = 0.01
    original = loop.poll_once

    def poll_then_stop() -> int:
        n = original()
        if n:
            stop.set()
        return n

    loop.poll_once = poll_then_stop  # type: ignore[method-assign]
    loop.consume_commands(stop)
    assert loop.loop_errors == 1 and node.nvml.resets == {1: 1} and all(c.closed for c in made)


def _agent(tmp_path: Path, clock: FakeClock, **kw) -> Agent:
    key = tmp_path / "command.key"
    key.write_bytes(KEY)
    key.chmod(0o600)
    settings = AgentSettings(node=NODE, health_file=None, commands_enabled=True, command_key_file=key, **kw)
    return Agent(settings, [CountingSource(NODE)], FakeSink(), clock=clock)


def test_an_agent_with_commands_publishes_results_on_its_events_topic(tmp_path: Path, fake_clock: FakeClock) -> None:
    agent = _agent(tmp_path, fake_clock)
    nvml = FakeNvml([FakeGpu(), FakeGpu()])
    consumer = FakeConsumer([[(NODE.encode(), sign(_command(), KEY))]])
    loop = attach_commands(agent, NvmlGpuOps(nvml, run=nvml.nvidia_smi), consumer_factory=lambda: consumer)
    assert loop.consume_commands in agent.loops
    loop.poll_once()
    agent.publish_pending()
    [msg] = agent.sink.delivered
    result = result_from_event(msg.value)
    assert msg.topic == "gpu.events" and msg.key == NODE.encode()
    assert result.status is ResultStatus.SUCCEEDED and nvml.resets == {1: 1}
    assert agent.health()["commands"]["outcomes"] == {"succeeded": 1}
    assert command_group(NODE) == "gpuops-agent-gpu-node-001"


def test_commands_need_a_key_file_and_refuse_a_world_readable_one(tmp_path: Path, fake_clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="command_key_file"):
        AgentSettings(node=NODE, commands_enabled=True)
    agent = _agent(tmp_path, fake_clock)
    agent.settings.command_key_file.chmod(0o604)
    with pytest.raises(CommandKeyError, match="chmod 600"):
        attach_commands(agent, NvmlGpuOps(FakeNvml([FakeGpu()])), consumer_factory=lambda: FakeConsumer([]))
    assert AgentSettings(node=NODE).commands_enabled is False


def test_nvml_that_hangs_at_start_does_not_stop_the_agent_and_commands_work_once_it_answers(
        monkeypatch: pytest.MonkeyPatch, fake_clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml([FakeGpu(pci_bus_id=f"00000000:{0x18 + i:02x}:00.0") for i in range(4)])
    release, init = threading.Event(), nvml.nvmlInit
    nvml.nvmlInit = lambda: (release.wait(), init())
    monkeypatch.setattr("collector.sources.nvml._import_pynvml", lambda: nvml)
    try:
        with caplog.at_level(logging.WARNING, logger="collector.gpu_reset"):
            ops = NvmlGpuOps(run=nvml.nvidia_smi, nvml_timeout_s=0.05)
        assert "NVML has not started within 0.05 s" in caplog.text
        results: list[CommandResult] = []
        handler = CommandHandler(NODE, KEY, ops, fake_clock, results.append)
        first = handler.handle(sign(_command(), KEY))
        assert first.code == "gpu_check_failed" and "has not answered an earlier call" in first.detail
    finally:
        release.set()
    wait_until(lambda: ops._calls.returned, timeout_s=5)
    second = handler.handle(sign(_command(id="act-0002", nonce="1" * 32), KEY))
    assert second.status is ResultStatus.SUCCEEDED and nvml.resets == {1: 1}
