"""Incident labels: ``onset_ts`` is when the first precursor appears in the node's telemetry (spec/recording.md),
so a node on dcgm-exporter's default counters, which sends no NVLink or ECC error counters, moves or drops it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from collector.recording import open_recording
from collector.schema import FaultClass
from collector.simulator import Simulator, simulate_recording
from collector.simulator.faults import NVLINK_PRECURSOR_FIELDS
from tests.collector.test_worlds import BUSY, _cfg

#: half the nodes on the default counters; only the two classes whose precursor starts in fields those lack
RANGES = replace(BUSY, rate_multiplier=(5000, 5000), exporter_default_node_frac=(0.5, 0.5))
MIX = {f: (1.0 if f in (FaultClass.HBM_ECC, FaultClass.NVLINK) else 0.0) for f in FaultClass}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    cfg = _cfg(seed=216, ranges=RANGES, nodes=12, hours=2.0, mix=MIX)
    out = tmp_path_factory.mktemp("onset") / "rec"
    simulate_recording(cfg, out)
    sim = Simulator(cfg)
    default = {n for n, d in zip(cfg.node_names(), cfg.world.exporter_default) if d}
    rec = open_recording(out)
    return cfg, sim.plan.incidents, rec.incidents(), default, rec.events(), rec.read_all("gpu")


def _ts(cfg, tick):
    return round(cfg.start_ts + tick * cfg.interval_s, 3)


def _warned_on_default(world, fault):
    """(planned incident, label, its GPU's samples, its GPU's XIDs) of each warned *fault* on a default-counter node."""
    _, planned, labels, default, events, gpu = world
    out = [(p, lab, gpu[(gpu["node"] == lab["node"]) & (gpu["gpu"] == lab["gpu"])],
            events[(events["kind"] == "xid") & (events["node"] == lab["node"]) & (events["gpu"] == lab["gpu"])])
           for p, lab in zip(planned, labels) if lab["node"] in default and lab["fault"] == fault and p.predictable]
    assert out, f"the test world has no warned {fault} fault on a default-counter node"
    return out


def test_a_node_that_sends_the_precursor_keeps_the_planned_onset(world):
    cfg, planned, labels, default, *_ = world
    kept = [(p, lab) for p, lab in zip(planned, labels) if lab["node"] not in default]
    assert kept
    for p, lab in kept:
        assert lab["onset_ts"] == (None if p.onset is None else _ts(cfg, p.onset)), lab
        assert lab["predictable"] == p.predictable


def test_nvlink_on_default_counters_shows_nothing_before_xid_74_so_it_is_unpredictable(world):
    for _, lab, part, xids in _warned_on_default(world, "nvlink"):
        assert lab["onset_ts"] is None and lab["predictable"] is False, lab
        assert "does not export" in lab["note"]
        assert all(part[col].isna().all() for col in NVLINK_PRECURSOR_FIELDS)
        nvlink_xids = xids["code"].isin([74, *range(144, 151)])
        assert not (nvlink_xids & (xids["ts"] < lab["failure_ts"] - 5)).any()
        assert (nvlink_xids & (xids["ts"] >= lab["failure_ts"] - 5)).any()   # and the failure itself is seen


def test_hbm_on_default_counters_starts_at_its_first_row_remap_or_xid_92(world):
    cfg = world[0]
    for p, lab, part, xids in _warned_on_default(world, "hbm_ecc"):
        planned_ts = _ts(cfg, p.onset)
        shown = xids[xids["code"].isin([63, 92]) & (xids["ts"] >= planned_ts - 5) & (xids["ts"] < lab["failure_ts"])]
        assert len(shown), lab
        assert lab["predictable"] is True and lab["onset_ts"] > planned_ts
        skew = cfg.world.skew_s[cfg.node_names().index(lab["node"])]   # the kernel log reads the node's own clock
        assert shown["ts"].min() == pytest.approx(lab["onset_ts"] + 0.25 + skew, abs=0.01), lab
        # and the one counter those nodes send for it holds still until then
        part = part[part["remapped_rows_corr"].notna()]
        before = part[(part["ts"] >= planned_ts) & (part["ts"] < lab["onset_ts"] - abs(skew) - 1)]["remapped_rows_corr"]
        assert len(before) and np.ptp(before.to_numpy()) == 0
