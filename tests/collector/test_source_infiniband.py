"""The InfiniBand source against captured sysfs trees and a small tmp tree."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from collector.schema import IB_COUNTERS, RecordType, validate_record
from collector.sources.base import PermanentSourceError
from collector.sources.infiniband import (InfinibandSource, parse_counter, parse_rate_gbps,
                                          parse_state)

H100_HCAS = {"mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9", "mlx5_bond_0"}


def _by_device(rows: list[dict]) -> dict[tuple[str, int], dict]:
    return {(r["device"], r["port"]): r for r in rows}


def test_h100_node_gives_all_nine_hcas_active_with_every_counter(h100_sysfs: Path) -> None:
    rows = InfinibandSource(node="h100-a", sysfs_root=h100_sysfs).sample(1767225600.0).net
    assert {r["device"] for r in rows} == H100_HCAS and len(rows) == 9
    for r in rows:
        assert validate_record(r, RecordType.NET) is None
        assert (r["port"], r["link_state"], r["phys_state"]) == (1, "ACTIVE", "LinkUp")
        assert r["node"] == "h100-a" and r["ts"] == 1767225600.0
        assert all(r[c] is not None for c in IB_COUNTERS), [c for c in IB_COUNTERS if r[c] is None]
        assert r["rate_gbps"] == (200.0 if r["device"] == "mlx5_bond_0" else 400.0)


def test_h100_counters_equal_the_files_and_hw_counters_become_extra_columns(h100_sysfs: Path) -> None:
    rows = _by_device(InfinibandSource(node="h100-a", sysfs_root=h100_sysfs).sample(0.0).net)
    bond = rows[("mlx5_bond_0", 1)]
    assert (bond["excessive_buffer_overrun_errors"], bond["port_rcv_errors"],
            bond["port_rcv_switch_relay_errors"], bond["port_xmit_wait"]) == (15, 14, 1, 2489603687)
    assert bond["port_xmit_data"] == 230442669431839  # 4-octet words, as the kernel reports them
    port_dir = h100_sysfs / "class/infiniband/mlx5_0/ports/1"
    hw = sorted(p.name for p in (port_dir / "hw_counters").iterdir())
    assert "local_ack_timeout_err" in hw and "out_of_sequence" in hw
    for name in hw:
        assert rows[("mlx5_0", 1)][name] == int((port_dir / "hw_counters" / name).read_text())


def test_node_exporter_tree_gives_missing_counters_as_null(shared_fixtures: Path) -> None:
    root = shared_fixtures / "infiniband/sysfs/node_exporter_fixture/sys"
    rows = _by_device(InfinibandSource(node="n", sysfs_root=root).sample(0.0).net)
    assert set(rows) == {("i40iw0", 1), ("mlx4_0", 1), ("mlx4_0", 2)}
    mlx4 = rows[("mlx4_0", 1)]
    assert mlx4["symbol_error"] is None and mlx4["VL15_dropped"] is None  # no such files in the capture
    assert mlx4["port_xmit_discards"] == 5 and mlx4["port_xmit_wait"] == 4294967295
    assert mlx4["rate_gbps"] == 40.0 and rows[("i40iw0", 1)]["rate_gbps"] == 10.0
    assert all(validate_record(r, RecordType.NET) is None for r in rows.values())


def test_procfs_tree_reads_three_vendors_and_roce_counters(shared_fixtures: Path) -> None:
    root = shared_fixtures / "infiniband/sysfs/procfs_fixture/fixtures/sys"
    rows = _by_device(InfinibandSource(node="n", sysfs_root=root).sample(0.0).net)
    assert {d for d, _ in rows} == {"hfi1_0", "mlx4_0", "mlx5_0"}
    assert rows[("hfi1_0", 1)]["rate_gbps"] == 100.0 and rows[("mlx5_0", 1)]["rate_gbps"] == 25.0
    assert rows[("mlx5_0", 1)]["phys_state"] == "ACTIVE"  # what that capture's file says
    assert rows[("mlx5_0", 1)]["local_ack_timeout_err"] == 131


def _port(root: Path, dev: str, port: int = 1, **counters: str) -> Path:
    p = root / "class/infiniband" / dev / "ports" / str(port)
    (p / "counters").mkdir(parents=True)
    (p / "state").write_text("1: DOWN\n")
    (p / "phys_state").write_text("2: Polling\n")
    (p / "rate").write_text("10 Gb/sec (4X)\n")
    for k, v in counters.items():
        (p / "counters" / k).write_text(v)
    return p


def test_unreadable_counter_is_null_not_zero(tmp_path: Path) -> None:
    _port(tmp_path, "mlx5_0", symbol_error="N/A (no PMA)\n", link_downed="3\n")
    r = InfinibandSource(node="n", sysfs_root=tmp_path).sample(0.0).net[0]
    assert r["symbol_error"] is None and r["link_downed"] == 3
    assert (r["link_state"], r["phys_state"]) == ("DOWN", "Polling")


def test_vanished_port_is_dropped_and_a_new_hca_is_found_on_rescan(tmp_path: Path) -> None:
    gone = _port(tmp_path, "mlx5_0", link_downed="1")
    _port(tmp_path, "mlx5_1", link_downed="2")
    src = InfinibandSource(node="n", sysfs_root=tmp_path, rescan_every=3)
    assert src.ports == [("mlx5_0", 1), ("mlx5_1", 1)]
    shutil.rmtree(gone.parents[1])
    assert [r["device"] for r in src.sample(1.0).net] == ["mlx5_1"]
    _port(tmp_path, "mlx5_2", link_downed="0")
    assert [r["device"] for r in src.sample(2.0).net] == ["mlx5_1"]
    assert [r["device"] for r in src.sample(3.0).net] == ["mlx5_1", "mlx5_2"]  # periodic rescan


def test_missing_sysfs_tree_fails_at_start_naming_the_path(tmp_path: Path) -> None:
    with pytest.raises(PermanentSourceError, match=str(tmp_path / "class" / "infiniband")):
        InfinibandSource(node="n", sysfs_root=tmp_path)


@pytest.mark.parametrize("text,want", [("4: ACTIVE", "ACTIVE"), ("5: LinkUp", "LinkUp"),
                                       ("3: Disabled", "Disabled"), ("ACTIVE", "ACTIVE"), ("", None)])
def test_state_text_gives_its_name(text: str, want: str | None) -> None:
    assert parse_state(text) == want


@pytest.mark.parametrize("text,want", [("400 Gb/sec (4X NDR)", 400.0), ("2.5 Gb/sec (1X SDR)", 2.5),
                                       ("200 Gb/sec (2X NDR)", 200.0), ("garbage", None), (None, None)])
def test_rate_text_gives_gbps(text: str | None, want: float | None) -> None:
    assert parse_rate_gbps(text) == want


def test_counter_text_gives_a_number_or_null() -> None:
    assert parse_counter("18446744073709551615") == 2.0**64 - 1
    assert parse_counter("N/A (no PMA)") is None and parse_counter(None) is None


@pytest.mark.parametrize("text", ["1.2.3 Gb/sec (4X)", "9" * 400 + " Gb/sec", "1" + "0" * 39 + " Gb/sec"])
def test_rate_no_float32_column_can_hold_is_null_and_never_raises(text: str) -> None:
    assert parse_rate_gbps(text) is None


@pytest.mark.parametrize("text", ["9" * 400, "0x" + "f" * 300, "9" * 5000])
def test_counter_beyond_float64_is_null_and_never_raises(text: str) -> None:
    assert parse_counter(text) is None


def test_port_directories_that_do_not_fit_the_int16_port_column_are_skipped(tmp_path: Path) -> None:
    _port(tmp_path, "mlx5_0", 1, symbol_error="9" * 400 + "\n")
    _port(tmp_path, "mlx5_0", 99999999999999999999)
    _port(tmp_path, "mlx5_0", 32768)
    (tmp_path / "class/infiniband/mlx5_0/ports/\u00b2").mkdir()  # "²".isdigit(), but int("²") raises
    src = InfinibandSource(node="n", sysfs_root=tmp_path)
    assert src.ports == [("mlx5_0", 1)]
    (row,) = src.sample(0.0).net
    assert row["symbol_error"] is None and validate_record(row, RecordType.NET) is None
