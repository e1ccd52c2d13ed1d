"""Replay features do not change now that events are streamed by window: the pipeline fed the
streamed windows gives the same feature batches and counts as fed the same windows holding
the slices of the events table read whole, as the reader did before (BMC readings, SEL
entries, XIDs and an operator maintenance window, read through pipeline.recordings and pipeline.bmc)."""

from __future__ import annotations

import dataclasses

import numpy as np
import orjson
import pandas as pd

from collector.recording import open_recording
from collector.recording.jsonl import read_jsonl
from collector.schema import FaultClass, RecordType, validate_frame
from collector.simulator import SimConfig, simulate_recording
from pipeline.recordings import RECORDING_COLUMNS
from pipeline.stream import FeaturePipeline


def _whole_read(path) -> pd.DataFrame:
    rows, _ = read_jsonl(path)
    ev = validate_frame(pd.DataFrame(rows), RecordType.EVENT).valid
    return ev.sort_values("ts", kind="stable").reset_index(drop=True)


def test_features_from_streamed_events_equal_those_from_the_whole_read(tmp_path):
    root = tmp_path / "rec"
    cfg = SimConfig(nodes=4, gpus_per_node=2, ports_per_node=1, hours=3, seed=11, rate_multiplier=3000,
                    mix={FaultClass.POWER: 1.0, FaultClass.THERMAL: 1.0, FaultClass.HBM_ECC: 1.0})
    simulate_recording(cfg, root)
    with open(root / "events.jsonl", "ab") as fh:  # appended last: out of time order by ~2 h
        fh.write(orjson.dumps({"ts": cfg.start_ts + 3000.0, "node": "gpu-node-002", "source": "operator",
                               "kind": "maintenance", "nodes": ["gpu-node-002"], "start": cfg.start_ts + 3000.0,
                               "end": cfg.start_ts + 6000.0, "reason": "firmware", "author": "ops"}) + b"\n")
    whole = _whole_read(root / "events.jsonl")
    assert {"bmc_sensor", "sel", "xid", "maintenance"} <= set(whole["kind"])
    windows = list(open_recording(root).iter_windows(1200, align=60, columns=RECORDING_COLUMNS))
    before = [dataclasses.replace(w, events=whole[(whole["ts"] >= w.start) & (whole["ts"] < w.end)]
                                  .reset_index(drop=True)) for w in windows]
    assert sum(len(w.events) for w in windows) == len(whole)
    new, old = FeaturePipeline(), FeaturePipeline()
    got, want = list(new.replay(windows)), list(old.replay(before))
    assert len(got) == len(want) > 100
    for g, w in zip(got, want):
        assert g.ts == w.ts and list(g.node) == list(w.node) and np.array_equal(g.gpu, w.gpu)
        assert np.array_equal(g.x, w.x, equal_nan=True)
    assert new.counts == old.counts
    assert new.counts.maintenance_events == 1 and new.counts.bmc_rows > 0 and new.counts.xid_rows > 0
