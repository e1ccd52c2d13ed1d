"""Ports down since they were ACTIVE are timed in telemetry time; flaps and unused ports are not down."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.settings import PipelineSettings
from pipeline.stream import FeaturePipeline
from tests.pipeline.synth import T0, Fleet, gpu_frame

SETTINGS = PipelineSettings(cadence_s=60, bucket_s=60, short_window_s=60, long_window_s=1800)


def _ports(states: list[str], interval_s: float, ports: int = 2) -> pd.DataFrame:
    """One node, *ports* ports: port mlx5_0 follows *states*, the others stay ACTIVE."""
    n = len(states)
    ts = np.repeat(T0 + np.arange(n) * interval_s + 0.5, ports)
    return pd.DataFrame({
        "ts": ts, "node": "gpu-node-000",
        "device": np.tile([f"mlx5_{p}" for p in range(ports)], n), "port": np.ones(n * ports, np.int16),
        "link_state": np.ravel([[s] + ["ACTIVE"] * (ports - 1) for s in states]),
    })


def _down_s(states: list[str], interval_s: float) -> pd.Series:
    gpu = gpu_frame(Fleet(nodes=1, gpus=2, samples=int(len(states) * interval_s / 10) + 1, interval_s=10.0))
    pipe = FeaturePipeline(SETTINGS)
    pipe.ingest_frames(gpu, _ports(states, interval_s))
    return pd.Series({b.ts: float(b.to_frame()["net_port_down_after_active_s"].max()) for b in pipe.flush()})


@pytest.mark.parametrize("interval_s", [5.0, 15.0, 30.0])
def test_a_port_down_after_being_active_is_timed_the_same_at_any_sampling_interval(interval_s):
    k = int(300 / interval_s)  # 5 min ACTIVE, then down for 5 min
    down = _down_s(["ACTIVE"] * k + ["DOWN"] * k, interval_s)
    assert down.iloc[-1] == pytest.approx(300 - interval_s)
    assert down.max() >= 120


def test_a_link_flap_that_recovers_leaves_no_time_down():
    down = _down_s(["ACTIVE"] * 30 + ["DOWN"] * 3 + ["ACTIVE"] * 30, 5.0)
    assert down.iloc[-1] == 0
    assert down.max() < 120


def test_a_port_that_was_never_active_counts_as_unused_not_down():
    down = _down_s(["DOWN"] * 120, 5.0)
    assert (down == 0).all()


def test_a_node_without_ports_has_no_port_down_time():
    pipe = FeaturePipeline(SETTINGS)
    pipe.ingest_frames(gpu_frame(Fleet(nodes=1, gpus=2, samples=12, interval_s=10.0)))
    assert np.isnan(pipe.flush()[0].to_frame()["net_port_down_after_active_s"]).all()


def test_a_port_down_longer_than_the_long_window_keeps_counting():
    k = int(600 / 15.0)  # 10 min ACTIVE, then down for 2 h: four long windows with no ACTIVE sample
    down = _down_s(["ACTIVE"] * k + ["DOWN"] * (12 * k), 15.0)
    assert down.iloc[-1] == pytest.approx(7200 - 15.0)
    assert down.is_monotonic_increasing


def test_a_port_that_comes_back_after_hours_down_stops_counting():
    k = int(600 / 15.0)
    down = _down_s(["ACTIVE"] * k + ["DOWN"] * (6 * k) + ["ACTIVE"] * k, 15.0)
    assert down.max() >= 3600 - 15.0
    assert down.iloc[-1] == 0
