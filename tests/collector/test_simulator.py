"""The fleet simulator: reproducible, every fault class with its precursor signature, confounders present."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from collector.recording import open_recording
from collector.schema import THROTTLE_HW_POWER_BRAKE, THROTTLE_HW_THERMAL, FaultClass
from collector.simulator import SimConfig, Simulator, simulate_recording


def all_classes_cfg(seed=7, **kw):
    """A small fleet with every fault class equally likely and many incidents."""
    base = dict(nodes=24, hours=12, interval_s=10, seed=seed, rate_multiplier=3000,
                mix={f: 1.0 for f in FaultClass}, predictable=None)
    base.update(kw)
    cfg = SimConfig(**{k: v for k, v in base.items() if v is not None})
    return cfg


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim") / "rec"
    summary = simulate_recording(all_classes_cfg(), out)
    rec = open_recording(out)
    return rec, rec.read_all("gpu"), rec.read_all("net"), rec.events(), rec.incidents(), summary


def test_same_seed_gives_identical_data_and_another_seed_does_not():
    def digest(seed):
        sim = Simulator(SimConfig(nodes=4, hours=2, seed=seed, rate_multiplier=2000))
        parts = [ch.gpu.column("ecc_sbe_vol").to_numpy(zero_copy_only=False) for ch in sim.chunks()]
        return np.concatenate(parts), json.dumps(sim.incidents(), sort_keys=True)

    a, b, c = digest(3), digest(3), digest(4)
    np.testing.assert_array_equal(a[0], b[0])
    assert a[1] == b[1] and a[1] != c[1]


def test_simulated_recording_is_valid_and_readable_by_plain_pandas(recording, tmp_path):
    rec, gpu, net, events, incidents, summary = recording
    cfg = all_classes_cfg()
    raw = pd.read_parquet(rec.path / "gpu.parquet")
    assert len(raw) == cfg.nodes * cfg.gpus_per_node * cfg.n_ticks == summary.gpu_samples
    assert len(gpu) == len(raw)  # nothing rejected by the contract
    assert len(net) == cfg.nodes * cfg.ports_per_node * cfg.n_ticks
    manifest = json.loads((rec.path / "manifest.json").read_text())
    assert manifest["format"] == "gpu-telemetry-recording" and manifest["version"] == 1
    assert set(gpu["node"].unique()) == set(manifest["nodes"])


def test_every_fault_class_occurs_with_and_without_warning(recording):
    incidents = recording[4]
    seen = {(i["fault"], i["predictable"]) for i in incidents}
    for f in FaultClass:
        assert any(fault == f.value for fault, _ in seen), f"no {f.value} incident"
    for f in (FaultClass.HBM_ECC, FaultClass.GPU_OFF_BUS, FaultClass.NVLINK, FaultClass.IB_LINK):
        assert (f.value, True) in seen and (f.value, False) in seen, f.value


def _series(gpu, inc, col, lo, hi):
    sel = gpu[(gpu["node"] == inc["node"]) & (gpu["ts"] >= lo) & (gpu["ts"] < hi)]
    if inc["gpu"] is not None:
        sel = sel[sel["gpu"] == inc["gpu"]]
    return sel[col].to_numpy(dtype=float, na_value=np.nan)


def _growth(gpu, inc, col):
    v = _series(gpu, inc, col, inc["onset_ts"] - 60, inc["failure_ts"] - 1)
    v = v[np.isfinite(v)]
    return v[-1] - v[0] if v.size else 0.0


GPU_PRECURSOR = {
    "hbm_ecc": ["ecc_sbe_vol", "remapped_rows_corr"],
    "nvlink": ["nvlink_crc_flit_err", "nvlink_replay_err"],
    "pcie": ["pcie_replay"],
}


def test_predictable_incidents_show_their_precursor_signature(recording):
    _, gpu, net, events, incidents, _ = recording
    checked = set()
    for inc in incidents:
        if not inc["predictable"] or inc["fault"] == "app_error":
            continue
        f = inc["fault"]
        if f in GPU_PRECURSOR:
            for col in GPU_PRECURSOR[f]:
                assert _growth(gpu, inc, col) > 0, (inc["id"], f, col)
            if f == "hbm_ecc":  # each row marked before the failure is in the kernel log, as a benign remap's is
                xid = events[(events["kind"] == "xid") & (events["node"] == inc["node"]) & (events["code"] == 63)
                             & (events["ts"] < inc["failure_ts"] - 1)]
                assert len(xid) == _growth(gpu, inc, "remapped_rows_corr"), inc["id"]
                # the driver logs XID 92 for the rate of corrected errors, whatever their cause: a benign
                # burst logs it at its onset, and so does this precursor once it errs as fast
                x92 = events[(events["kind"] == "xid") & (events["node"] == inc["node"]) & (events["code"] == 92)
                             & (events["ts"] > inc["onset_ts"]) & (events["ts"] < inc["failure_ts"])]
                assert len(x92) >= 1, inc["id"]
        elif f == "gpu_off_bus":
            assert _growth(gpu, inc, "pcie_replay") > 0, inc["id"]
        elif f == "thermal":
            temp = _series(gpu, inc, "temp_gpu_c", inc["onset_ts"], inc["failure_ts"])
            thr = _series(gpu, inc, "throttle_reasons", inc["onset_ts"], inc["failure_ts"]).astype(np.int64)
            assert np.nanmax(temp) - np.nanmin(temp) > 15 and (thr & THROTTLE_HW_THERMAL).any(), inc["id"]
        elif f == "power":
            thr = _series(gpu, inc, "throttle_reasons", inc["onset_ts"], inc["failure_ts"]).astype(np.int64)
            assert (thr & THROTTLE_HW_POWER_BRAKE).any(), inc["id"]
        elif f == "ib_link":
            ports = net[(net["node"] == inc["node"]) & (net["ts"] >= inc["onset_ts"]) & (net["ts"] < inc["failure_ts"])]
            grow = ports.groupby("device")["symbol_error"].agg(lambda s: s.iloc[-1] - s.iloc[0])
            assert grow.max() > 10, inc["id"]
        elif f == "fail_slow":
            window = gpu[(gpu["node"] == inc["node"]) & (gpu["ts"] >= inc["onset_ts"] + 120)
                         & (gpu["ts"] < inc["failure_ts"]) & (gpu["util_gpu"] > 50)]
            by_gpu = window.groupby("gpu")["sm_clock_mhz"].median()
            assert by_gpu[inc["gpu"]] < 0.8 * by_gpu.drop(inc["gpu"]).median(), inc["id"]
            assert _growth(gpu, inc, "ecc_sbe_vol") == 0 and _growth(gpu, inc, "pcie_replay") == 0
        checked.add(f)
    assert checked == {f.value for f in FaultClass} - {"app_error"}


def test_failures_without_warning_show_nothing_before_the_failure(recording):
    _, gpu, _, events, incidents, _ = recording
    for inc in incidents:
        if inc["predictable"] or inc["fault"] not in GPU_PRECURSOR:
            continue
        for col in GPU_PRECURSOR[inc["fault"]]:
            v = _series(gpu, inc, col, inc["failure_ts"] - 1800, inc["failure_ts"] - 1)
            v = v[np.isfinite(v)]
            assert v.size == 0 or v[-1] == v[0], (inc["id"], col)


def test_failures_leave_their_kernel_log_signature(recording):
    _, gpu, net, events, incidents, _ = recording
    events = events[events["kind"] == "xid"]  # the kernel log (BMC events are tested in test_simulator_bmc.py)
    expected = {"hbm_ecc": 48, "gpu_off_bus": 79, "nvlink": 74}
    for inc in incidents:
        ev = events[(events["node"] == inc["node"]) & (events["ts"] >= inc["failure_ts"])
                    & (events["ts"] < inc["failure_ts"] + 60)]
        if inc["fault"] in expected:
            assert expected[inc["fault"]] in set(ev["code"].astype(int)), inc["id"]
        if inc["fault"] == "app_error":
            assert set(ev["code"].astype(int)) <= {13, 31, 43} and len(ev) >= 1
        if inc["fault"] == "ib_link":
            after = net[(net["node"] == inc["node"]) & (net["ts"] > inc["failure_ts"] + 1)
                        & (net["ts"] < inc["failure_ts"] + 60)]
            assert (after["link_state"] == "DOWN").any(), inc["id"]


def test_confounders_are_present_and_unlabelled(recording):
    _, gpu, net, events, incidents, _ = recording
    ecc_gpus = {(i["node"], i["gpu"]) for i in incidents if i["fault"] == "hbm_ecc"}
    last = gpu.groupby(["node", "gpu"])["ecc_sbe_agg"].max()
    noisy = [k for k, v in last.items() if v > 0 and k not in ecc_gpus]
    assert noisy, "no healthy GPU with a steady low SBE rate"
    # counters reset to zero by reboots: a volatile counter goes down somewhere
    d = gpu.sort_values(["node", "gpu", "ts"]).groupby(["node", "gpu"])["thermal_violation_us"].diff()
    pw = gpu.sort_values(["node", "gpu", "ts"]).groupby(["node", "gpu"])["power_violation_us"].diff()
    assert (d < 0).any() or (pw < 0).any()
    # congestion: port_xmit_wait bursts on ports with no errors
    w = net.sort_values(["node", "device", "ts"]).groupby(["node", "device"])["port_xmit_wait"].diff()
    assert (w > 1e7).any()
    # job boundaries and checkpoint dips: busy GPUs dip to low utilisation and come back
    u = gpu[(gpu["node"] == gpu["node"].iloc[0]) & (gpu["gpu"] == 0)]["util_gpu"].to_numpy()
    assert (u < 30).any() and (u > 85).any()
