"""The NVML source against a fake NVML module (our boundary) and real nvidia-smi captures."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import pynvml
import pytest

from collector.schema import GPU_COLUMNS, RecordType, validate_record
from collector.sources.base import PermanentSourceError
from collector.sources.nvml import NvmlSource, NvmlUnavailableError
from fake_nvml import FakeGpu, FakeNvml

MIB = 2**20


def _source(gpus: list[FakeGpu]) -> tuple[NvmlSource, FakeNvml]:
    fake = FakeNvml(gpus)
    return NvmlSource(node="gpu-node-001", nvml=fake), fake


def test_eight_gpus_give_eight_valid_rows_with_every_contract_column() -> None:
    src, _ = _source([FakeGpu(uuid=f"GPU-{i}", pci_bus_id=f"00000000:{0x18 + i:02X}:00.0") for i in range(8)])
    rows = src.sample(1767225600.0).gpu
    assert [r["gpu"] for r in rows] == list(range(8))
    for r in rows:
        assert validate_record(r, RecordType.GPU) is None
        assert set(RecordType.GPU.column_names) <= set(r)
        assert r["node"] == "gpu-node-001" and r["ts"] == 1767225600.0
    assert rows[3]["gpu_uuid"] == "GPU-3"


def test_nvml_units_become_contract_units() -> None:
    src, _ = _source([FakeGpu()])
    r = src.sample(0.0).gpu[0]
    assert r["fb_used_mib"] == 19818 and r["fb_free_mib"] == 81559 - 479 - 19818
    assert r["power_w"] == pytest.approx(631.95) and r["power_limit_w"] == 700.0
    assert r["thermal_violation_us"] == 12_000.0 and r["power_violation_us"] == 3_500_000.0
    assert (r["util_gpu"], r["util_mem"], r["temp_gpu_c"], r["temp_mem_c"]) == (97, 41, 59, 54)
    assert (r["sm_clock_mhz"], r["mem_clock_mhz"], r["throttle_reasons"]) == (1980, 2619, 0x4)


def test_counters_map_to_their_columns_and_nvlink_sums_over_links() -> None:
    src, _ = _source([FakeGpu()])
    r = src.sample(0.0).gpu[0]
    assert (r["ecc_sbe_vol"], r["ecc_dbe_vol"], r["ecc_sbe_agg"], r["ecc_dbe_agg"]) == (3, 0, 120, 1)
    assert (r["retired_pages_sbe"], r["retired_pages_dbe"], r["retired_pages_pending"]) == (2, 1, 0)
    assert (r["remapped_rows_corr"], r["remapped_rows_uncorr"], r["row_remap_pending"],
            r["row_remap_failure"]) == (2, 1, 0, 0)
    assert r["pcie_replay"] == 7
    # 18 links; DL counters replay=0 → 1, recovery=1 → 0, crc_flit=2 → 2, crc_data=3 → 3 per link
    assert (r["nvlink_replay_err"], r["nvlink_recovery_err"], r["nvlink_crc_flit_err"],
            r["nvlink_crc_data_err"]) == (18, 0, 36, 54)


def test_unsupported_field_is_null_and_the_rest_of_the_sample_is_kept() -> None:
    gpu = FakeGpu(unsupported={"nvmlDeviceGetRetiredPages", "nvmlDeviceGetNvLinkState", "temp_mem"})
    src, fake = _source([gpu])
    for t in range(3):
        r = src.sample(float(t)).gpu[0]
    assert r["retired_pages_sbe"] is None and r["retired_pages_dbe"] is None
    assert r["nvlink_crc_flit_err"] is None and r["temp_mem_c"] is None
    assert r["ecc_dbe_agg"] == 1 and r["power_w"] == pytest.approx(631.95)
    assert src.field_errors == {}
    # "not supported" is remembered: asked once per cause at the first sample, never again
    assert fake.calls["nvmlDeviceGetRetiredPages"] == 2


def test_other_nvml_error_nulls_the_field_is_counted_and_retried() -> None:
    gpu = FakeGpu(failing={"nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_GPU_IS_LOST})
    src, fake = _source([gpu, FakeGpu()])
    for t in range(3):
        rows = src.sample(float(t)).gpu
    assert rows[0]["power_w"] is None and rows[1]["power_w"] == pytest.approx(631.95)
    assert rows[0]["temp_gpu_c"] == 59
    assert src.field_errors["power"] == 3
    gpu.failing.clear()
    assert src.sample(4.0).gpu[0]["power_w"] == pytest.approx(631.95)



def test_a_gpu_nvml_reports_lost_gets_no_row_and_no_more_calls_until_it_answers(
        caplog: pytest.LogCaptureFixture) -> None:
    """Off the bus, every NVML call on the GPU fails: its silence, not a row of nulls, is what the pipeline and the
    simulator read as a GPU gone."""
    lost = FakeGpu(uuid="GPU-lost", pci_bus_id="00000000:19:00.0")
    src, fake = _source([FakeGpu(), lost])
    src.sample(0.0)
    calls = fake.calls["nvmlDeviceGetPowerUsage"]
    lost.failing.update({fn: pynvml.NVML_ERROR_GPU_IS_LOST for fn in
                         ("nvmlDeviceGetPciInfo", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetUtilizationRates")})
    with caplog.at_level("INFO", logger="collector.sources.nvml"):
        for t in (1.0, 2.0):
            assert [r["gpu"] for r in src.sample(t).gpu] == [0]
        assert src.lost == {1} and fake.calls["nvmlDeviceGetPowerUsage"] == calls + 2  # GPU 0's only
        assert sum("GPU 1 (GPU-lost) is lost" in r.getMessage() for r in caplog.records) == 1
        lost.failing.clear()
        assert [r["gpu"] for r in src.sample(3.0).gpu] == [0, 1]
    assert src.lost == set() and "GPU 1 (GPU-lost) answers again" in caplog.text

class PerFunctionNvmlSource(NvmlSource):
    """Reads every column through its own NVML function (what the source did before batching)."""

    fields = ()


def test_counters_come_from_one_field_values_call_per_gpu_not_one_call_each() -> None:
    src, fake = _source([FakeGpu(), FakeGpu()])
    for t in range(3):
        src.sample(float(t))
    assert fake.calls["nvmlDeviceGetFieldValues"] == 6
    for fn in ("nvmlDeviceGetViolationStatus", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows",
               "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetPowerManagementLimit"):
        assert fake.calls.get(fn, 0) == 0, fn


@pytest.mark.parametrize("gpu", [
    FakeGpu(),
    FakeGpu(ecc={(0, 0): 2**33 + 5, (1, 0): 4, (0, 1): 2**40, (1, 1): 9}, viol_power_ns=29_859_953_728,
            retired_pending=1, remapped=(6, 2, 1, 1), pcie_replay=123456, power_limit_mw=612345),
    FakeGpu(unsupported={"nvmlDeviceGetRetiredPages", "nvmlDeviceGetRetiredPagesPendingStatus", "temp_mem"}),
], ids=["h100-like", "large-counters", "hopper-no-retirement"])
def test_batched_row_equals_the_row_read_function_by_function(gpu: FakeGpu) -> None:
    batched = NvmlSource(node="n", nvml=FakeNvml([gpu])).sample(1.0).gpu[0]
    legacy_fake = FakeNvml([gpu])
    legacy = PerFunctionNvmlSource(node="n", nvml=legacy_fake).sample(1.0).gpu[0]
    assert legacy_fake.calls.get("nvmlDeviceGetViolationStatus", 0) == 2  # really the other path
    assert batched == legacy


def test_a_field_id_the_driver_refuses_is_read_through_its_own_function_from_then_on() -> None:
    src, fake = _source([FakeGpu(refused_fields={"power_limit_w", "pcie_replay"})])
    rows = [src.sample(float(t)).gpu[0] for t in range(3)]
    assert all(r["power_limit_w"] == 700.0 and r["pcie_replay"] == 7 for r in rows)
    assert fake.calls["nvmlDeviceGetPowerManagementLimit"] == 3
    assert fake.calls["nvmlDeviceGetFieldValues"] == 3  # still one batched call per tick for the rest
    assert fake.calls.get("nvmlDeviceGetViolationStatus", 0) == 0
    assert src.field_errors == {}


def test_a_driver_without_field_values_reads_every_column_through_its_own_function() -> None:
    src, fake = _source([FakeGpu(unsupported={"nvmlDeviceGetFieldValues"})])
    r = src.sample(0.0).gpu[0]
    src.sample(1.0)
    assert r["power_violation_us"] == 3_500_000.0 and r["ecc_sbe_agg"] == 120 and r["remapped_rows_corr"] == 2
    assert r["temp_mem_c"] is None  # HBM temperature exists only as a field value
    assert fake.calls["nvmlDeviceGetFieldValues"] == 2  # the batch once, the HBM temperature once
    assert src.field_errors == {}


def test_a_lost_gpu_nulls_its_batched_fields_counts_them_and_retries_them() -> None:
    gpu = FakeGpu(failing={"nvmlDeviceGetTotalEccErrors": pynvml.NVML_ERROR_GPU_IS_LOST})
    src, fake = _source([gpu])
    for t in range(2):
        r = src.sample(float(t)).gpu[0]
    assert r["ecc_sbe_vol"] is None and r["ecc_dbe_agg"] is None and r["pcie_replay"] == 7
    assert src.field_errors["ecc_sbe_vol"] == 2 and fake.calls.get("nvmlDeviceGetTotalEccErrors", 0) == 0
    gpu.failing.clear()
    assert src.sample(2.0).gpu[0]["ecc_sbe_vol"] == 3


def test_missing_nvml_library_raises_one_permanent_error_naming_it() -> None:
    with pytest.raises(NvmlUnavailableError) as err:
        NvmlSource(node="n1", nvml=FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    assert isinstance(err.value, PermanentSourceError)
    assert "libnvidia-ml.so.1" in str(err.value) and "--sources" in str(err.value)


def test_driver_not_loaded_says_so() -> None:
    with pytest.raises(NvmlUnavailableError, match="driver is not loaded"):
        NvmlSource(node="n1", nvml=FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))


def test_pci_bus_ids_map_to_gpu_indexes_in_kernel_log_form() -> None:
    src, _ = _source([FakeGpu(pci_bus_id="00000000:3B:00.0"), FakeGpu(pci_bus_id="00000000:9b:00.0")])
    assert src.gpu_index_by_pci() == {"0000:3b:00": 0, "0000:9b:00": 1}


def test_close_shuts_nvml_down_once() -> None:
    src, fake = _source([FakeGpu()])
    src.close()
    src.close()
    assert fake.shutdown_called


# --------------------------------------------------------------------------- nvidia-smi captures

#: nvidia-smi --query-gpu field → (schema column, NVML function the fake must refuse when N/A)
SMI_FIELDS = {
    "index": ("gpu", None),
    "uuid": ("gpu_uuid", None),
    "utilization.gpu": ("util_gpu", "nvmlDeviceGetUtilizationRates"),
    "utilization.memory": ("util_mem", "nvmlDeviceGetUtilizationRates"),
    "memory.used": ("fb_used_mib", "nvmlDeviceGetMemoryInfo"),
    "memory.free": ("fb_free_mib", "nvmlDeviceGetMemoryInfo"),
    "temperature.gpu": ("temp_gpu_c", "nvmlDeviceGetTemperature"),
    "temperature.memory": ("temp_mem_c", "temp_mem"),
    "power.draw": ("power_w", "nvmlDeviceGetPowerUsage"),
    "power.limit": ("power_limit_w", "nvmlDeviceGetPowerManagementLimit"),
    "clocks.current.sm": ("sm_clock_mhz", "nvmlDeviceGetClockInfo"),
    "clocks.current.memory": ("mem_clock_mhz", "nvmlDeviceGetClockInfo"),
    "clocks_event_reasons.active": ("throttle_reasons", "nvmlDeviceGetCurrentClocksEventReasons"),
    "ecc.errors.corrected.volatile.total": ("ecc_sbe_vol", "nvmlDeviceGetTotalEccErrors"),
    "ecc.errors.uncorrected.volatile.total": ("ecc_dbe_vol", "nvmlDeviceGetTotalEccErrors"),
    "ecc.errors.corrected.aggregate.total": ("ecc_sbe_agg", "nvmlDeviceGetTotalEccErrors"),
    "ecc.errors.uncorrected.aggregate.total": ("ecc_dbe_agg", "nvmlDeviceGetTotalEccErrors"),
    "retired_pages.single_bit_ecc.count": ("retired_pages_sbe", "nvmlDeviceGetRetiredPages"),
    "retired_pages.double_bit.count": ("retired_pages_dbe", "nvmlDeviceGetRetiredPages"),
    "retired_pages.pending": ("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus"),
    "remapped_rows.correctable": ("remapped_rows_corr", "nvmlDeviceGetRemappedRows"),
    "remapped_rows.uncorrectable": ("remapped_rows_uncorr", "nvmlDeviceGetRemappedRows"),
    "remapped_rows.pending": ("row_remap_pending", "nvmlDeviceGetRemappedRows"),
    "remapped_rows.failure": ("row_remap_failure", "nvmlDeviceGetRemappedRows"),
}
UNITS = {c.name: c.unit for c in GPU_COLUMNS}
SMI_UNIT = {"%": "%", "MiB": "MiB", "W": "W", "MHz": "MHz"}


def _query_gpu_rows(capture: Path) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The ``load :: query-gpu`` CSV of an nvidia_gpu_exporter capture: units by field, rows."""
    text = capture.read_text(errors="replace")
    m = re.search(r"# load :: query-gpu.*?\n#{20,}\n(.*?)(?:\n\n|\Z)", text, re.S)
    assert m, f"no query-gpu section in {capture.name}"
    rows = list(csv.reader(io.StringIO(m.group(1)), skipinitialspace=True))
    header = [re.sub(r" \[.*\]$", "", h) for h in rows[0]]
    units = {re.sub(r" \[.*\]$", "", h): (re.findall(r"\[(.*)\]$", h) or [""])[0] for h in rows[0]}
    return units, [dict(zip(header, r)) for r in rows[1:] if r]


def _value(raw: str) -> float | str | None:
    raw = raw.strip()
    if raw.startswith("[") or raw in ("N/A", ""):
        return None
    if raw in ("Yes", "No"):
        return float(raw == "Yes")
    if raw.startswith("0x"):
        return float(int(raw, 16))
    if raw.startswith("GPU-"):
        return raw
    return float(raw.split()[0])


def _linux_captures(root: Path) -> list[Path]:
    return sorted((root / "nvidia_smi" / "nvidia_gpu_exporter").glob("linux-*.txt"))


def test_nvidia_smi_units_match_the_contract_units(shared_fixtures: Path) -> None:
    captures = _linux_captures(shared_fixtures)
    assert any("h100" in c.name for c in captures) and any("h200" in c.name for c in captures)
    for capture in captures:
        units, _ = _query_gpu_rows(capture)
        for smi, (col, _) in SMI_FIELDS.items():
            if units.get(smi):
                assert SMI_UNIT[units[smi]] == UNITS[col], (capture.name, smi)


@pytest.mark.parametrize("model", ["h100-80gb-hbm3", "h200", "h100-mig", "h200-mig", "l40s", "geforce-rtx-4080-super"])
def test_nvml_source_on_a_captured_gpu_agrees_with_nvidia_smi(shared_fixtures: Path, model: str) -> None:
    capture = next(c for c in _linux_captures(shared_fixtures) if f"nvidia-{model}__" in c.name)
    _, rows = _query_gpu_rows(capture)
    smi = {SMI_FIELDS[k][0]: _value(v) for k, v in rows[0].items() if k in SMI_FIELDS}
    refuse = {fn for k, (col, fn) in SMI_FIELDS.items() if fn and smi[col] is None}
    reserved = _value(rows[0]["memory.reserved"]) or 0
    ecc = {(0, 0): smi["ecc_sbe_vol"], (1, 0): smi["ecc_dbe_vol"],
           (0, 1): smi["ecc_sbe_agg"], (1, 1): smi["ecc_dbe_agg"]}
    gpu = FakeGpu(
        uuid=smi["gpu_uuid"], util_gpu=smi["util_gpu"], util_mem=smi["util_mem"],
        mem_total=int((smi["fb_used_mib"] + smi["fb_free_mib"] + reserved) * MIB),
        mem_reserved=int(reserved * MIB), mem_used=int(smi["fb_used_mib"] * MIB),
        temp_gpu=smi["temp_gpu_c"], temp_mem=smi["temp_mem_c"],
        power_mw=round((smi["power_w"] or 0) * 1000), power_limit_mw=round((smi["power_limit_w"] or 0) * 1000),
        sm_clock=smi["sm_clock_mhz"], mem_clock=smi["mem_clock_mhz"], throttle=int(smi["throttle_reasons"] or 0),
        ecc=ecc, retired_sbe=[0] * int(smi["retired_pages_sbe"] or 0),
        retired_dbe=[0] * int(smi["retired_pages_dbe"] or 0), retired_pending=smi["retired_pages_pending"],
        remapped=tuple(smi[c] for c in ("remapped_rows_corr", "remapped_rows_uncorr",
                                        "row_remap_pending", "row_remap_failure")),
        unsupported=refuse)
    row = NvmlSource(node="captured", nvml=FakeNvml([gpu])).sample(0.0).gpu[0]
    for col, want in smi.items():
        if col == "gpu":
            continue
        got = row[col]
        if want is None:
            assert got is None, f"{model}: {col} is N/A in nvidia-smi but {got!r} here"
        else:
            assert got == pytest.approx(want), f"{model}: {col}"
    if model in ("h100-80gb-hbm3", "h200"):  # Hopper: no page retirement, row remapping instead
        assert row["retired_pages_sbe"] is None and row["remapped_rows_corr"] == 0
