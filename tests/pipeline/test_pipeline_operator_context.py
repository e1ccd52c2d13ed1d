"""Operator context in the pipeline (issue 13): per-part baselines learn nothing from muted time
(maintenance events, silences), and a repaired part — GPU reset, reboot or port reset in or just
after muted time or by gpuops' own command, a new GPU at the same index — starts a new baseline,
with lifetime counters re-anchored on a swap; a reset on its own keeps the part's history. Live and
replay still give the same features."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from collector.commands import CommandResult, ResultStatus, result_event
from collector.operator_events import maintenance_event
from collector.wire import TOPIC_EVENTS, TOPIC_TELEMETRY, decode_telemetry, encode_event, encode_telemetry_arrow
from pipeline.batch import FeatureBatch
from pipeline.bus import InProcessBus
from pipeline.features import NET_ERROR_COUNTERS
from pipeline.settings import PipelineSettings
from pipeline.stream import FeaturePipeline
from pipeline.worker import StreamWorker
from tests.pipeline.synth import Fleet, event_messages, events_frame, gpu_frame, net_frame, telemetry_messages

SETTINGS = PipelineSettings(cadence_s=60, bucket_s=60, short_window_s=60, long_window_s=600)
SBE = 0  # index of the ecc_sbe stem in the GPU baselines (pipeline.features._BASELINE_STEMS)
WIN = (1200.0, 2400.0)  # the maintenance window, s after t0


def _rows(df: pd.DataFrame, fleet: Fleet, node: int, gpu: int, after: float, before: float = np.inf) -> np.ndarray:
    ts = df["ts"].to_numpy() - fleet.t0
    return ((df["node"] == f"gpu-node-{node:03d}") & (df["gpu"] == gpu)).to_numpy() & (ts >= after) & (ts < before)


def with_burst(df: pd.DataFrame, fleet: Fleet, per_sample: float = 50.0) -> pd.DataFrame:
    """node 0 GPU 0 logs *per_sample* extra corrected ECC errors per sample inside the window."""
    df = df.copy()
    part = _rows(df, fleet, 0, 0, -np.inf)
    inside = _rows(df, fleet, 0, 0, *WIN)
    extra = np.cumsum(inside[part]) * per_sample
    df.loc[part, "ecc_sbe_vol"] += extra
    return df


def maintenance(fleet: Fleet, nodes=("gpu-node-000",)) -> dict:
    return maintenance_event(list(nodes), fleet.t0 + WIN[0], fleet.t0 + WIN[1], "reseat GPU 0", author="alice")


def replay(gpu: pd.DataFrame, net: pd.DataFrame | None = None, events: pd.DataFrame | None = None,
           until: float | None = None) -> tuple[FeaturePipeline, list[FeatureBatch]]:
    pipe = FeaturePipeline(SETTINGS)
    pipe.ingest_frames(gpu, net, events)
    return pipe, (pipe.advance(until) if until is not None else pipe.flush())


def gpu_baseline(pipe: FeaturePipeline, node: int, gpu: int) -> tuple[np.ndarray, np.ndarray]:
    slot = int(pipe.keys.gpus.slots_of(pipe.keys.nodes.ids_of(np.array([f"gpu-node-{node:03d}"])), [gpu])[0])
    return pipe.baselines.gpu.k[:, slot].copy(), pipe.baselines.gpu.t[:, slot].copy()


def feature(batches: list[FeatureBatch], name: str, node: int, gpu: int, at: float) -> float:
    b = next(b for b in batches if b.ts == at)
    return float(b.column(name)[(b.node == f"gpu-node-{node:03d}") & (b.gpu == gpu)][0])


# ---- muted time ------------------------------------------------------------------------------


def test_a_burst_during_maintenance_is_not_learnt_while_the_same_burst_without_it_is() -> None:
    fleet = Fleet(nodes=2, gpus=2, ports=1, samples=360, interval_s=10.0, seed=3)  # one hour
    g = gpu_frame(fleet)
    ev = pd.DataFrame([maintenance(fleet)])
    burst_muted, _ = replay(with_burst(g, fleet), events=ev)
    quiet_muted, _ = replay(g, events=ev)
    burst_learnt, _ = replay(with_burst(g, fleet))
    assert burst_muted.counts.maintenance_events == 1 and burst_muted.counts.muted_node_ticks == 20
    k, t = gpu_baseline(burst_muted, 0, 0)
    k_quiet, t_quiet = gpu_baseline(quiet_muted, 0, 0)
    np.testing.assert_array_equal(k, k_quiet)  # the burst left no trace in the baseline
    np.testing.assert_array_equal(t, t_quiet)
    k_learnt, _ = gpu_baseline(burst_learnt, 0, 0)
    assert k_learnt[SBE] > k[SBE] + 1000  # the control learnt the burst (20 min x 6 x 50 errors)
    # the other node was not muted: it learnt exactly as without the window
    np.testing.assert_array_equal(gpu_baseline(burst_muted, 1, 0)[0], gpu_baseline(burst_learnt, 1, 0)[0])


def test_muted_time_neither_learns_nor_forgets_and_features_still_read_the_frozen_baseline() -> None:
    fleet = Fleet(nodes=1, gpus=2, ports=1, samples=360, interval_s=10.0, seed=4)
    g = with_burst(gpu_frame(fleet), fleet)
    pipe = FeaturePipeline(SETTINGS)
    pipe.mute(["gpu-node-000"], fleet.t0 + WIN[0], fleet.t0 + WIN[1])
    pipe.ingest_frames(g, net_frame(fleet))
    before = pipe.advance(fleet.t0 + WIN[0])
    k0, t0 = gpu_baseline(pipe, 0, 0)
    port_k0 = pipe.baselines.port.k.copy()
    during = pipe.advance(fleet.t0 + WIN[1])
    k1, t1 = gpu_baseline(pipe, 0, 0)
    np.testing.assert_array_equal(k1, k0)  # no decay over 20 minutes either
    np.testing.assert_array_equal(t1, t0)
    np.testing.assert_array_equal(pipe.baselines.port.k, port_k0)  # the node's ports froze too
    excess = [feature(b, "ecc_sbe_excess_long", 0, 0, b[-1].ts) for b in (before, during)]
    assert excess[1] > excess[0] + 2.0  # the burst still shows against the frozen baseline
    pipe.flush()
    assert gpu_baseline(pipe, 0, 0)[1][SBE] > t1[SBE]  # learning resumes after the window


# ---- repairs ---------------------------------------------------------------------------------


def _reset_at(g: pd.DataFrame, fleet: Fleet, node: int, gpu: int, at: float = 1800.0) -> pd.DataFrame:
    """GPU *gpu* of *node* is reset at *at*: its volatile corrected-ECC counter drops to 0."""
    g = g.copy()
    after = _rows(g, fleet, node, gpu, at)
    g.loc[after, "ecc_sbe_vol"] -= g.loc[after, "ecc_sbe_vol"].min()
    return g


def _window(fleet: Fleet, start: float, end: float, node: str = "gpu-node-000") -> pd.DataFrame:
    return pd.DataFrame([maintenance_event([node], fleet.t0 + start, fleet.t0 + end, "reseat", author="bob")])


def test_a_gpu_reset_as_a_repair_restarts_that_gpus_baseline_and_not_its_neighbours() -> None:
    fleet = Fleet(nodes=1, gpus=3, ports=0, samples=240, interval_s=10.0, seed=5)
    g = _reset_at(gpu_frame(fleet), fleet, 0, 1)
    # the reset comes 10 minutes after a maintenance window ended: the reboot that closes it
    pipe, _ = replay(g, events=_window(fleet, 600.0, 1200.0), until=fleet.t0 + 1860)
    assert (pipe.counts.baseline_restarts, pipe.counts.unplanned_resets) == (1, 0)
    _, t_reset = gpu_baseline(pipe, 0, 1)
    assert t_reset[SBE] <= SETTINGS.cadence_s  # only the reset tick's short window since the restart
    for neighbour in (0, 2):
        assert gpu_baseline(pipe, 0, neighbour)[1][SBE] > 1000.0


def test_a_reset_outside_any_repair_keeps_the_parts_history() -> None:
    fleet = Fleet(nodes=1, gpus=2, ports=0, samples=240, interval_s=10.0, seed=5)
    g = _reset_at(gpu_frame(fleet), fleet, 0, 1)
    # no window at all, and one that ended 3,800 s (more than the hour of grace) before the reset
    for events in (None, _window(fleet, -4000.0, -2000.0)):
        pipe, _ = replay(g, events=events, until=fleet.t0 + 1860)
        assert (pipe.counts.baseline_restarts, pipe.counts.unplanned_resets) == (0, 1)
        assert gpu_baseline(pipe, 0, 1)[1][SBE] > 1500.0  # the GPU that reset on its own kept its baseline


def test_a_reset_after_gpuops_own_command_is_a_repair() -> None:
    fleet = Fleet(nodes=2, gpus=1, ports=0, samples=240, interval_s=10.0, seed=9)
    g = _reset_at(_reset_at(gpu_frame(fleet), fleet, 0, 0), fleet, 1, 0)
    result = result_event(CommandResult(command_id="act-1", node="gpu-node-000", gpu=0,
                                               status=ResultStatus.SUCCEEDED, detail="reset",
                                               at=fleet.t0 + 1790.0))
    pipe, _ = replay(g, events=pd.DataFrame([result]), until=fleet.t0 + 1860)
    assert (pipe.counts.baseline_restarts, pipe.counts.unplanned_resets) == (1, 1)
    assert gpu_baseline(pipe, 0, 0)[1][SBE] <= SETTINGS.cadence_s  # reset by gpuops: a new baseline
    assert gpu_baseline(pipe, 1, 0)[1][SBE] > 1500.0                # reset on its own: history kept


def test_a_port_counter_reset_in_maintenance_restarts_that_ports_baseline_only() -> None:
    fleet = Fleet(nodes=1, gpus=1, ports=2, samples=240, interval_s=10.0, seed=6)
    n = net_frame(fleet)
    after = ((n["device"] == "mlx5_1") & (n["ts"] - fleet.t0 >= 1800.0)).to_numpy()
    n.loc[after, "symbol_error"] -= n.loc[after, "symbol_error"].min()
    pipe, _ = replay(gpu_frame(fleet), n, _window(fleet, 1700.0, 1900.0), until=fleet.t0 + 1860)
    assert pipe.counts.baseline_restarts == 1
    slots = {dev: s for s, (_, dev, _) in enumerate(pipe.keys.ports.keys)}
    j = NET_ERROR_COUNTERS.index("symbol_error")
    assert pipe.baselines.port.t[j, slots["mlx5_1"]] <= SETTINGS.cadence_s
    assert pipe.baselines.port.t[j, slots["mlx5_0"]] > 1500.0


def with_swap(g: pd.DataFrame, fleet: Fleet, at: float = 1800.0, lifetime_jump: float = 5000.0) -> pd.DataFrame:
    """GPU 0 of node 0 is replaced at *at*: a new gpu_uuid, and the new GPU's lifetime counters
    (remapped rows, aggregate ECC) higher by *lifetime_jump* than the old one's."""
    g = g.copy()
    g["gpu_uuid"] = [f"GPU-{n}-{i}" for n, i in zip(g["node"], g["gpu"])]
    new = _rows(g, fleet, 0, 0, at)
    g.loc[new, "gpu_uuid"] = "GPU-replacement"
    for c in ("remapped_rows_corr", "ecc_dbe_agg"):
        g.loc[new, c] += lifetime_jump
    return g


def test_a_new_gpu_uuid_restarts_the_baseline_and_re_anchors_lifetime_counters() -> None:
    fleet = Fleet(nodes=1, gpus=2, ports=0, samples=240, interval_s=10.0, seed=7)
    g = with_swap(gpu_frame(fleet), fleet)
    pipe, got = replay(g, until=fleet.t0 + 1860)
    assert pipe.counts.gpu_swaps == 1 and pipe.counts.baseline_restarts == 1
    assert gpu_baseline(pipe, 0, 0)[1][SBE] <= SETTINGS.cadence_s
    assert gpu_baseline(pipe, 0, 1)[1][SBE] > 1500.0
    swapped = feature(got, "remapped_rows_corr_per_h_long", 0, 0, fleet.t0 + 1860)
    neighbour = feature(got, "remapped_rows_corr_per_h_long", 0, 1, fleet.t0 + 1860)
    assert swapped < 2 * neighbour  # Poisson(2) per sample either way: no 5,000-row step
    # the control: the same step without the new UUID is counted (it is not a decrease to re-anchor)
    _, control = replay(g.drop(columns=["gpu_uuid"]), until=fleet.t0 + 1860)
    assert feature(control, "remapped_rows_corr_per_h_long", 0, 0, fleet.t0 + 1860) > 10 * neighbour


def test_a_first_uuid_and_an_unchanged_one_are_not_swaps() -> None:
    fleet = Fleet(nodes=2, gpus=2, ports=0, samples=60, interval_s=10.0)
    g = with_swap(gpu_frame(fleet), fleet, at=1e9)  # the swap never comes
    pipe, _ = replay(g)
    assert pipe.counts.gpu_swaps == 0 and pipe.counts.baseline_restarts == 0


# ---- live = replay ---------------------------------------------------------------------------


@pytest.mark.parametrize("wire_format", ["json", "arrow"])
def test_live_and_replay_give_the_same_features_with_maintenance_resets_and_swaps(wire_format: str) -> None:
    fleet = Fleet(nodes=3, gpus=2, ports=2, samples=300, interval_s=10.0, jitter_s=1.0, seed=8)
    g = with_swap(with_burst(gpu_frame(fleet), fleet), fleet, at=2700.0)
    reset = _rows(g, fleet, 1, 1, 2000.0)
    g.loc[reset, "pcie_replay"] -= g.loc[reset, "pcie_replay"].min()
    n = net_frame(fleet)
    xids = events_frame(fleet, [(35, 0, 1, 79), (1500, 2, None, 48)])
    maint = maintenance(fleet, nodes=("gpu-node-000", "gpu-node-002"))
    want_pipe, want = replay(g, n, pd.concat([xids, pd.DataFrame([maint])], ignore_index=True))
    assert want_pipe.counts.muted_node_ticks == 40 and want_pipe.counts.gpu_swaps == 1
    assert (want_pipe.counts.baseline_restarts, want_pipe.counts.unplanned_resets) == (1, 1)  # swap; reset

    bus = InProcessBus(partitions=3)
    msgs = telemetry_messages(g, n, fleet.interval_s)
    for node, raw in msgs:
        wire = raw if wire_format == "json" else encode_telemetry_arrow(decode_telemetry(raw))
        bus.produce(TOPIC_TELEMETRY, node, wire)
    events = event_messages(xids) + [(maint["node"], encode_event(maint))]
    for node, raw in events:
        bus.produce(TOPIC_EVENTS, node, raw)
    got: list[FeatureBatch] = []
    worker = StreamWorker(bus, FeaturePipeline(SETTINGS), got.append)
    while worker.messages < len(msgs) + len(events) or any(bus.backlog().values()):
        worker.run_once()
    worker.drain()
    c = worker.pipeline.counts
    assert c.late_rows == 0 and worker.deadlettered == 0
    assert (c.muted_node_ticks, c.gpu_swaps, c.baseline_restarts, c.unplanned_resets) == (40, 1, 1, 1)
    assert [b.ts for b in got] == [b.ts for b in want]
    for a, b in zip(got, want):
        pd.testing.assert_frame_equal(a.to_frame(), b.to_frame(), check_exact=True)


def test_a_recordings_maintenance_event_mutes_its_replay_as_the_frames_do(tmp_path) -> None:  # noqa: ANN001
    from collector.recording import Manifest, open_recording, write_recording
    from pipeline.recordings import RECORDING_COLUMNS

    fleet = Fleet(nodes=2, gpus=2, ports=1, samples=360, interval_s=10.0, seed=9)
    g, n = with_burst(gpu_frame(fleet), fleet), net_frame(fleet)
    maint = maintenance(fleet)
    no_author = {k: v for k, v in maintenance(fleet, nodes=("gpu-node-001",)).items() if k != "author"}
    manifest = Manifest(start=fleet.t0, end=fleet.t0 + 3600, interval_s=10.0, nodes=["gpu-node-000", "gpu-node-001"],
                        gpus_per_node=2, source="test")
    rec = open_recording(write_recording(tmp_path / "rec", manifest, g, n, [maint, no_author]))
    pipe = FeaturePipeline(SETTINGS)
    got = list(pipe.replay(rec.iter_windows(600.0, align=60.0, columns=RECORDING_COLUMNS)))
    want_pipe, want = replay(g, n, pd.DataFrame([maint]))
    assert pipe.counts.maintenance_events == 2 and pipe.counts.muted_node_ticks == 40  # author is optional
    assert pipe.counts.rejected_rows == 0
    np.testing.assert_array_equal(gpu_baseline(pipe, 0, 0)[0], gpu_baseline(want_pipe, 0, 0)[0])
    assert [b.ts for b in got] == [b.ts for b in want]
