"""The NVML source against a real NVIDIA H200's recorded NVML answers, and nvidia-smi beside them.

``data/nvml_h200`` was captured on a real H200 (``SOURCE.txt``): the tape replays, call for call,
what NVML answered the source over 48 one-second ticks, idle and under a matmul load.
"""

from __future__ import annotations

import csv
import gzip
import json
import re
from pathlib import Path

import pytest

from collector.schema import RecordType, validate_record
from collector.sources.nvml import NvmlSource
from nvml_tape import TapeNvml
from test_source_nvml import _value as _num  # nvidia-smi's value text: N/A, hex, Yes/No, units

DATA = Path(__file__).parent / "data" / "nvml_h200"


@pytest.fixture(scope="module")
def recorded() -> list[dict]:
    with gzip.open(DATA / "rows.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def replayed(recorded: list[dict]) -> tuple[list[dict], NvmlSource, TapeNvml]:
    tape = TapeNvml(DATA / "tape.json.gz")
    src = NvmlSource(node="h200-device", nvml=tape)
    rows = [src.sample(r["ts"]).gpu[0] for r in recorded]
    src.close()
    return rows, src, tape


def test_replaying_the_h200_tape_rebuilds_every_recorded_row_exactly(recorded, replayed) -> None:
    rows, src, tape = replayed
    assert len(rows) == tape.ticks == 48
    for want, got in zip(recorded, rows):
        assert got == {k: v for k, v in want.items() if k != "phase"}
    assert tape.unanswered() == {}  # the replay asked exactly what the real GPU was asked
    assert src.field_errors == {}


def test_every_h200_row_is_a_valid_gpu_record_with_the_columns_hopper_has(replayed) -> None:
    rows, _, _ = replayed
    for r in rows:
        assert validate_record(r, RecordType.GPU) is None
    # Hopper: row remapping instead of page retirement; one GPU in the VM, so no NVLink peers
    never = {"retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending", "nvlink_crc_flit_err",
             "nvlink_crc_data_err", "nvlink_replay_err", "nvlink_recovery_err", "xid_last"}
    for col in set(RecordType.GPU.column_names) - {"xid_last"}:
        values = [r[col] for r in rows]
        if col in never:
            assert values == [None] * len(rows), col
        else:
            assert None not in values, col


def test_under_load_the_h200_power_caps_and_its_violation_counter_runs_with_the_clock(recorded) -> None:
    load = [r for r in recorded if r["phase"] == "load" and r["throttle_reasons"] == 0x4]  # SW power cap
    assert len(load) >= 25
    assert sorted(r["power_w"] for r in load)[len(load) // 2] > 0.95 * load[0]["power_limit_w"]
    first, last = load[1], load[-2]  # not the ramp's edges
    held = (last["power_violation_us"] - first["power_violation_us"]) / 1e6
    assert held == pytest.approx(last["ts"] - first["ts"], rel=0.05)  # µs, and 100 % of the time
    idle = [r for r in recorded if r["phase"] == "idle"]
    assert len({r["power_violation_us"] for r in idle}) == 1  # idle: the counter stands still


def _smi_rows() -> list[dict[str, str]]:
    with (DATA / "smi.csv").open() as f:
        rdr = csv.reader(f, skipinitialspace=True)
        header = [re.sub(r" \[.*\]$", "", h) for h in next(rdr)]
        return [dict(zip(header, row)) for row in rdr]


#: nvidia-smi field → (column, absolute tolerance): nvidia-smi ran right after the source's read
SMI = {
    "utilization.gpu": ("util_gpu", 2), "utilization.memory": ("util_mem", 2),
    "memory.used": ("fb_used_mib", 1), "memory.free": ("fb_free_mib", 1),
    "temperature.gpu": ("temp_gpu_c", 1), "temperature.memory": ("temp_mem_c", 1),
    "power.draw": ("power_w", 5), "power.limit": ("power_limit_w", 0),
    "clocks.current.sm": ("sm_clock_mhz", 60), "clocks.current.memory": ("mem_clock_mhz", 0),
    "ecc.errors.corrected.volatile.total": ("ecc_sbe_vol", 0),
    "ecc.errors.uncorrected.volatile.total": ("ecc_dbe_vol", 0),
    "ecc.errors.corrected.aggregate.total": ("ecc_sbe_agg", 0),
    "ecc.errors.uncorrected.aggregate.total": ("ecc_dbe_agg", 0),
    "retired_pages.single_bit_ecc.count": ("retired_pages_sbe", 0),
    "retired_pages.double_bit.count": ("retired_pages_dbe", 0),
    "retired_pages.pending": ("retired_pages_pending", 0),
    "remapped_rows.correctable": ("remapped_rows_corr", 0),
    "remapped_rows.uncorrectable": ("remapped_rows_uncorr", 0),
    "remapped_rows.pending": ("row_remap_pending", 0), "remapped_rows.failure": ("row_remap_failure", 0),
}


def test_the_source_agrees_with_nvidia_smi_on_the_same_h200(recorded) -> None:
    by_ts = {round(r["ts"], 3): r for r in recorded}
    smi_rows = _smi_rows()
    assert len(smi_rows) == 18
    for smi in smi_rows:
        row = by_ts[float(smi["sample_ts"])]
        assert (row["gpu_uuid"], row["pci_bus_id"]) == (smi["uuid"], smi["pci.bus_id"])
        for field, (col, tol) in SMI.items():
            want, got = _num(smi[field]), row[col]
            if want is None:
                assert got is None, f"{field} is N/A in nvidia-smi but {col} = {got!r}"
            else:
                assert got == pytest.approx(want, abs=tol), (smi["phase"], field)
        if smi["phase"] != "load":  # steady: the clock-event reasons read the same bits
            assert row["throttle_reasons"] == _num(smi["clocks_event_reasons.active"])


def _xid_lines() -> list[str]:
    return [line for line in (DATA / "xid31.txt").read_text().splitlines() if line and not line.startswith("#")]


def test_a_real_h200_application_xid_is_read_for_gpu_0_and_takes_no_action(tmp_path, recorded) -> None:
    """XID 31 (an MMU fault: the job's bad pointer) from driver 580, as /dev/kmsg and dmesg wrote it:
    the kernel-log source gives GPU 0 through the bus id NVML reported, and no rule acts on it."""
    import pandas as pd

    from collector.sources.kmsg import KmsgSource
    from collector.xid import class_of
    from models.bundle import ModelBundle
    from pipeline.stream import FeaturePipeline

    by_pci = NvmlSource(node="h200-device", nvml=TapeNvml(DATA / "tape.json.gz")).gpu_index_by_pci()
    assert by_pci == {"0000:00:06": 0}
    kmsg_line, dmesg_line = _xid_lines()
    boot = recorded[20]["ts"] - 38.915516  # the fault lands among the recorded rows
    log = tmp_path / "kmsg"
    log.write_text("")
    ev = KmsgSource("h200-device", log, boot_ts=boot, gpu_index_by_pci=by_pci).event(kmsg_line, now=0.0)
    same = KmsgSource("h200-device", log, gpu_index_by_pci=by_pci).event(dmesg_line, now=0.0)
    assert (ev["kind"], ev["code"], ev["gpu"], ev["pci_bus_id"]) == ("xid", 31, 0, "0000:00:06")
    assert (same["code"], same["gpu"]) == (31, 0) and validate_record(ev, RecordType.EVENT) is None
    assert ev["ts"] == pytest.approx(recorded[20]["ts"])
    assert class_of(31).name == "app" and class_of(31).action.value == "none"

    gpu = pd.DataFrame([{k: v for k, v in r.items() if k != "phase"} for r in recorded])
    pipe = FeaturePipeline()
    pipe.ingest_frames(gpu, None, pd.DataFrame([ev]))
    batches = [b for b in pipe.flush() if len(b)]
    rules = ModelBundle.rules_only()
    seen = [b for b in batches if b.x[:, b.names.index("xid_app_count_short")].max() >= 1]
    assert seen, "the XID reached no tick's features"
    for b in batches:
        assert (rules.score(b.x).rule == -1).all()  # the job's fault: nothing acts on the node
