"""The vectorised features equal a slow, obvious pandas implementation on random input."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from collector.schema import GPU_COUNTERS
from pipeline.settings import PipelineSettings
from pipeline.stream import FeaturePipeline
from tests.pipeline.synth import Fleet, gpu_frame

SETTINGS = PipelineSettings(cadence_s=60, bucket_s=60, short_window_s=60, long_window_s=300)


def reference(df: pd.DataFrame, tick_end: float, short_s: float, long_s: float) -> pd.DataFrame:
    """Per-GPU features at *tick_end*, computed row by row with pandas (slow but plain)."""
    out = []
    df = df[df.ts < tick_end].sort_values(["node", "gpu", "ts"])
    for (node, gpu), g in df.groupby(["node", "gpu"], sort=True):
        row = {"node": node, "gpu": gpu}
        for c in GPU_COUNTERS:
            prev = g[c].shift(1)
            d = g[c] - prev
            g = g.assign(**{f"d_{c}": np.where(d < 0, g[c], d)})
        g = g.assign(dt=g.ts.diff())
        for w, span in (("short", short_s), ("long", long_s)):
            win = g[g.ts >= tick_end - span]
            for gauge in ("temp_gpu_c", "power_w", "sm_clock_mhz"):
                v = win[gauge].astype(float)
                row[f"{gauge}_mean_{w}"] = v.mean()
                row[f"{gauge}_std_{w}"] = v.std(ddof=0)
                row[f"{gauge}_slope_{w}"] = np.polyfit(win.ts - tick_end, v, 1)[0] * 60 if len(v) >= 2 else np.nan
            ok = win.dt.notna()
            row[f"ecc_sbe_per_h_{w}"] = win.loc[ok, "d_ecc_sbe_vol"].sum() / win.loc[ok, "dt"].sum() * 3600
            row[f"pcie_replay_per_min_{w}"] = win.loc[ok, "d_pcie_replay"].sum() / win.loc[ok, "dt"].sum() * 60
            row[f"throttle_hw_slowdown_frac_{w}"] = ((win.throttle_reasons.astype(int) & 0x8) != 0).mean()
        out.append(row)
    ref = pd.DataFrame(out)
    med = ref.groupby("node").temp_gpu_c_mean_short.transform("median")
    ref["temp_gpu_excess_vs_peers"] = ref.temp_gpu_c_mean_short - med
    return ref


@pytest.mark.parametrize("seed", [0, 1])
def test_features_match_a_slow_pandas_reference_on_random_input(seed: int) -> None:
    fleet = Fleet(nodes=3, gpus=4, samples=50, interval_s=7.0, jitter_s=3.0, seed=seed)
    df = gpu_frame(fleet)
    # a counter reset and an irregular gap for one GPU
    df.loc[(df.node == "gpu-node-001") & (df.gpu == 2) & (df.ts > fleet.t0 + 200), "pcie_replay"] -= 1e4
    df["pcie_replay"] = df["pcie_replay"].clip(lower=0)
    df = df.drop(df[(df.node == "gpu-node-002") & (df.gpu == 0) & (df.ts.between(fleet.t0 + 100, fleet.t0 + 170))].index)
    pipe = FeaturePipeline(SETTINGS)
    pipe.ingest_frames(df)
    batches = {b.ts: b for b in pipe.flush()}
    for tick_end in (fleet.t0 + 240, fleet.t0 + 300):
        got = batches[tick_end].to_frame().sort_values(["node", "gpu"]).reset_index(drop=True)
        want = reference(df, tick_end, SETTINGS.short_window_s, SETTINGS.long_window_s)
        for col in want.columns.drop(["node", "gpu"]):
            np.testing.assert_allclose(got[col].to_numpy(float), want[col].to_numpy(float), rtol=2e-4, atol=1e-4,
                                       err_msg=f"{col} at {tick_end}")
