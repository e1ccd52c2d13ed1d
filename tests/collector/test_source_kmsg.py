"""The kernel-log XID source: every real XID line, whole real logs, rotation, partial lines."""

from __future__ import annotations

import csv
import os
from datetime import datetime, timezone
from pathlib import Path

import pytest

from collector.schema import RecordType, validate_record
from collector.sources.base import PermanentSourceError
from collector.sources.kmsg import KmsgSource, gpu_index_from_sysfs, line_time, parse_xid_line

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."


def _pci_between_parens(line: str) -> str:
    """Independent of the parser: the text after '(PCI:' up to the next ')'."""
    start = line.index("(PCI:") + len("(PCI:")
    return line[start:line.index(")", start)]


def _real_lines(root: Path) -> list[dict[str, str]]:
    with open(root / "xid" / "xid_lines_real.tsv", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def test_all_458_real_lines_give_their_kind_code_and_pci_id(shared_fixtures: Path) -> None:
    rows = _real_lines(shared_fixtures)
    assert len(rows) == 458
    src_kinds = set()
    for row in rows:
        x = parse_xid_line(row["raw_line"])
        assert x is not None, row["raw_line"]
        assert (x.kind, x.code) == (row["kind"].lower(), int(row["code"])), row["raw_line"]
        assert x.pci_bus_id == _pci_between_parens(row["raw_line"])
        src_kinds.add(x.kind)
    assert src_kinds == {"xid", "sxid"}


def test_every_real_line_becomes_a_valid_event_with_the_raw_line_unchanged(shared_fixtures: Path,
                                                                          tmp_path: Path) -> None:
    log = tmp_path / "empty.log"
    log.write_text("")
    src = KmsgSource("gpu-node-001", log, gpu_index_by_pci={"0000:19:00": 2})
    for row in _real_lines(shared_fixtures):
        ev = src.event(row["raw_line"], now=1767225600.0)
        assert validate_record(ev, RecordType.EVENT) is None
        assert ev["message"] == row["raw_line"] and ev["source"] == "kmsg"
        assert ev["gpu"] == (2 if "PCI:0000:19:00)" in row["raw_line"] and ev["kind"] == "xid" else None)


def _whole_file(path: Path, **kw) -> list[dict]:
    src = KmsgSource("gpu-node-001", path, from_start=True, drain=True, **kw)
    try:
        return src.sample(1767225600.0).events
    finally:
        src.close()


@pytest.mark.parametrize("name", ["kmsg.1.log", "dmesg.decode.iso.log.1"])
def test_xid_free_real_logs_give_no_event(shared_fixtures: Path, name: str) -> None:
    path = shared_fixtures / "xid" / "gpud" / name
    assert len(path.read_text().splitlines()) > 40
    assert _whole_file(path) == []


def test_real_log_with_an_hbm_failure_gives_the_48_63_94_chain_in_order(shared_fixtures: Path) -> None:
    events = _whole_file(shared_fixtures / "xid/gpud/dmesg.0.log", gpu_index_by_pci={"0000:19:00.0": 5})
    assert [e["code"] for e in events] == [48, 63] + [94] * 9
    assert {e["gpu"] for e in events} == {5} and {e["pci_bus_id"] for e in events} == {"0000:19:00"}
    first = datetime(2024, 11, 15, 12, 2, 3, 470068, tzinfo=timezone.utc).timestamp()
    assert events[0]["ts"] == pytest.approx(first)
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)


def test_decoded_dmesg_log_gives_one_event_per_xid_line(shared_fixtures: Path) -> None:
    path = shared_fixtures / "xid/gpud/dmesg.decode.iso.log.0"
    want = [ln for ln in path.read_text().splitlines() if "NVRM: Xid" in ln]
    events = _whole_file(path)
    assert [e["message"] for e in events] == want
    assert [e["code"] for e in events] == [int(ln.split("): ", 1)[1].split(",")[0]) for ln in want]
    assert sorted({e["code"] for e in events}) == [13, 43]


def test_kmsg_record_time_is_boot_time_plus_kernel_microseconds(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    log.write_text("")
    src = KmsgSource("n", log, boot_ts=1_700_000_000.0)
    ev = src.event("4,4012,206764307,-;" + XID_79, now=0.0)
    assert ev["ts"] == pytest.approx(1_700_000_206.764307) and ev["code"] == 79
    assert src.event("6,3964,206764307,-;nvidia-nvswitch2: open (major=510)", now=0.0) is None


def test_line_without_a_time_is_stamped_with_the_sample_time(tmp_path: Path) -> None:
    log = tmp_path / "messages"
    log.write_text("")
    ev = KmsgSource("n", log).event("Feb 23 16:24:18 host kernel: " + XID_79, now=1234.5)
    assert ev["ts"] == 1234.5 and ev["pci_bus_id"] == "0000:3b:00"


def test_dmesg_time_formats_are_understood() -> None:
    assert line_time("[ 6781741.548779] x") == (None, pytest.approx(6781741.548779))
    assert line_time("> [6781753.400584] nvidia-nvswitch1: x")[1] == pytest.approx(6781753.400584)
    iso = line_time("kern  :warn  : 2025-01-21T02:21:33,498559+00:00 NVRM: x")[0]
    assert iso == pytest.approx(datetime(2025, 1, 21, 2, 21, 33, 498559, tzinfo=timezone.utc).timestamp())
    assert line_time("[Sun Feb 23 16:24:18 2025] NVRM: x")[0] is not None
    assert line_time("no time here") == (None, None)


def test_old_driver_format_without_pci_prefix_is_parsed() -> None:
    x = parse_xid_line("[  100.1] NVRM: Xid (0000:02:00): 31, Ch 00000001, engmask 00000101")
    assert (x.kind, x.code, x.pci_bus_id) == ("xid", 31, "0000:02:00")


# --------------------------------------------------------------------------- following a file


def _append(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def test_follower_starts_at_the_end_and_sees_only_new_lines(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(f"[1.0] {XID_79}\n")
    src = KmsgSource("n", log)
    assert src.sample(1.0).events == []
    _append(log, f"[2.0] {XID_79.replace(': 79,', ': 48,')}\n")
    assert [e["code"] for e in src.sample(2.0).events] == [48]


def test_partial_line_waits_for_its_newline(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    src = KmsgSource("n", log)
    _append(log, "[5.0] NVRM: Xid (PCI:0000:3b:00): 7")
    assert src.sample(1.0).events == []
    _append(log, "9, pid=1, GPU has fallen off the bus.\n[6.0] NVRM: Xid (PCI:0000:3b")
    events = src.sample(2.0).events
    assert [e["code"] for e in events] == [79]
    assert events[0]["message"] == "[5.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus."
    _append(log, ":00): 94, Contained\n")
    assert [e["code"] for e in src.sample(3.0).events] == [94]


def test_rotation_reads_the_old_file_to_its_end_then_the_new_one_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    src = KmsgSource("n", log)
    _append(log, "[1.0] NVRM: Xid (PCI:0000:3b:00): 13, a\n")
    assert [e["code"] for e in src.sample(1.0).events] == [13]
    os.rename(log, tmp_path / "kern.log.1")
    _append(tmp_path / "kern.log.1", "[2.0] NVRM: Xid (PCI:0000:3b:00): 31, written late to the old file\n")
    assert [e["code"] for e in src.sample(2.0).events] == [31]  # path missing: keep reading the old file
    _append(tmp_path / "kern.log.1", "[3.0] NVRM: Xid (PCI:0000:3b:00): 43, last old line\n")
    log.write_text("[4.0] NVRM: Xid (PCI:0000:3b:00): 48, first new line\n"
                   "[5.0] NVRM: Xid (PCI:0000:3b:00): 63, second new line\n")
    assert [e["code"] for e in src.sample(3.0).events] == [43, 48, 63]
    _append(log, "[6.0] NVRM: Xid (PCI:0000:3b:00): 94, after rotation\n")
    assert [e["code"] for e in src.sample(4.0).events] == [94]


def test_truncated_file_is_read_again_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    src = KmsgSource("n", log)
    _append(log, "x" * 500 + "\n" + f"[1.0] {XID_79}\n")
    assert [e["code"] for e in src.sample(1.0).events] == [79]
    with open(log, "w") as f:  # copytruncate
        f.write("[2.0] NVRM: Xid (PCI:0000:3b:00): 48, after truncation\n")
    assert [e["code"] for e in src.sample(2.0).events] == [48]


def test_character_device_is_read_one_record_at_a_time(tmp_path: Path) -> None:
    master, slave = os.openpty()  # a real character device with record-per-read semantics
    try:
        src = KmsgSource("n", Path(os.ttyname(slave)), from_start=True, boot_ts=1000.0)
        os.write(master, b"6,1,2000000,-;hello\n4,2,3000000,-;" + XID_79.encode() + b"\n")
        events = []
        for _ in range(100):  # the tty delivers asynchronously; poll a bounded number of times
            events += src.sample(0.0).events
            if events:
                break
        assert [(e["code"], e["ts"]) for e in events] == [(79, pytest.approx(1003.0))]
        src.close()
    finally:
        os.close(master)
        os.close(slave)


def test_missing_log_fails_at_start_naming_the_path(tmp_path: Path) -> None:
    with pytest.raises(PermanentSourceError, match="nope.log"):
        KmsgSource("n", tmp_path / "nope.log")


def test_sysfs_pci_order_gives_gpu_indexes_for_nvidia_devices_only(tmp_path: Path) -> None:
    devs = tmp_path / "bus/pci/devices"
    for bus, vendor, klass in [("0000:9b:00.0", "0x10de", "0x030200"), ("0000:18:00.0", "0x10de", "0x030200"),
                               ("0000:1a:00.0", "0x15b3", "0x020700"), ("0000:05:00.0", "0x10de", "0x068000")]:
        (devs / bus).mkdir(parents=True)
        (devs / bus / "vendor").write_text(vendor + "\n")
        (devs / bus / "class").write_text(klass + "\n")
    assert gpu_index_from_sysfs(tmp_path) == {"0000:18:00": 0, "0000:9b:00": 1}
