"""The shipped model on a real GPU: an NVIDIA H200 at work, idle and at its power cap, is healthy.

``tests/collector/data/nvml_h200/agent_rows.jsonl.gz`` is what ``gpuops agent --sources nvml
--interval 1`` printed on a real H200 over four minutes (bench/results/nvml-h200.md): idle, a
30 s matmul load at the 700 W cap (SW power cap the whole time, the power violation counter
running with the clock), then five on/off cycles. One GPU with no peers is a sanity check, not a
false-action rate; it guards against a model that reads a busy real GPU as a failing one.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pandas as pd

from models.bundle import load_default
from pipeline.stream import FeaturePipeline
from remediation.policy import PolicyConfig

ROWS = Path(__file__).parents[1] / "collector" / "data" / "nvml_h200" / "agent_rows.jsonl.gz"


def test_a_real_h200_at_work_is_healthy_to_the_shipped_model_and_rules() -> None:
    with gzip.open(ROWS, "rt") as f:
        gpu = pd.DataFrame([json.loads(line) for line in f]).drop(columns=["type"])
    assert len(gpu) == 233 and (gpu.throttle_reasons == 0x4).sum() >= 30  # it really ran at its power cap
    pipe = FeaturePipeline()
    pipe.ingest_frames(gpu)
    batches = [b for b in pipe.flush() if len(b)]
    assert len(batches) >= 4
    bundle = load_default()
    cfg = PolicyConfig()
    busy = 0
    for b in batches:
        s = bundle.score(b.x)
        assert (s.rule == -1).all(), b.ts
        assert s.p_fail.max() < cfg.alert_threshold, (b.ts, float(s.p_fail.max()))
        busy += int(b.x[:, b.names.index("util_gpu_mean_short")].max() > 50)
    assert busy >= 2  # ticks at work were scored, not only idle ones
