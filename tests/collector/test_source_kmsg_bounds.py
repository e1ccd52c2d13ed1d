"""The kernel-log parser under hostile input: out-of-range numbers, huge lines, random bytes.

A kernel log is text we do not control. Whatever a line holds, the source never raises,
and every event it makes fits the contract's columns and encodes for the wire. The fuzz
cases use seeded ``random`` so a failure is reproduced by running the test again.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from collector.schema import RecordType, validate_record
from collector.sources.kmsg import MAX_LINE_CHARS, MAX_XID_CODE, KmsgSource, line_time, parse_xid_line
from collector.wire import decode_event, encode_event

NOW = 1767225600.0
INT16 = (-(2**15), 2**15 - 1)
INT32 = (-(2**31), 2**31 - 1)
BIG = "99999999999999999999"  # the line that killed the agent: beyond int64


def _source(tmp_path: Path, **kw) -> KmsgSource:
    log = tmp_path / "kern.log"
    log.touch()
    return KmsgSource("gpu-node-001", log, gpu_index_by_pci={"0000:18:00": 0}, boot_ts=NOW - 3600, **kw)


def _check_event(ev: dict) -> None:
    """The event fits spec §3's column types and goes through the wire format and back."""
    assert validate_record(ev, RecordType.EVENT) is None, ev
    assert ev["code"] is None or 0 <= ev["code"] <= MAX_XID_CODE <= INT32[1]
    assert ev["gpu"] is None or INT16[0] <= ev["gpu"] <= INT16[1]
    assert isinstance(ev["ts"], float) and math.isfinite(ev["ts"])
    back = decode_event(encode_event(ev))
    assert back["code"] == ev["code"] and back["ts"] == ev["ts"]


@pytest.mark.parametrize("number", [BIG, str(2**31), str(2**63), str(2**64), str(MAX_XID_CODE + 1), "9" * 5000])
def test_out_of_range_xid_code_keeps_the_raw_line_with_a_null_code_and_counts_it(tmp_path: Path,
                                                                                 number: str) -> None:
    src = _source(tmp_path)
    line = f"NVRM: Xid (PCI:0000:18:00): {number}, pid=1, name=python, Graphics Exception"
    ev = src.event(line, NOW)
    assert ev is not None and ev["kind"] == "xid" and ev["code"] is None and ev["message"] == line
    assert ev["gpu"] == 0 and ev["pci_bus_id"] == "0000:18:00"
    _check_event(ev)
    assert src.problems == {f"xid code above {MAX_XID_CODE}": 1}


def test_codes_in_range_are_kept_with_leading_zeros_and_the_largest_sxid(tmp_path: Path) -> None:
    src = _source(tmp_path)
    assert src.event("NVRM: Xid (PCI:0000:18:00): 0000000000000000000000079, off the bus", NOW)["code"] == 79
    assert src.event(f"nvidia-nvswitch0: SXid (PCI:0000:05:00.0): {MAX_XID_CODE}, Fatal", NOW)["code"] == MAX_XID_CODE
    assert not src.problems


@pytest.mark.parametrize("prefix", ["[99999999999999999999999999999999.000000] ",
                                    f"6,1,{'9' * 400},-;", f"[{'9' * 400}.5] ", "[ 4000000000.5] ",
                                    "9999-12-31T23:59:59,999999+00:00 ", "[Fri Dec 31 23:59:59 9999] "])
def test_a_time_out_of_range_falls_back_to_the_sample_time_and_never_raises(tmp_path: Path, prefix: str) -> None:
    src = _source(tmp_path)
    ev = src.event(prefix + "NVRM: Xid (PCI:0000:18:00): 48, DBE", NOW)
    assert ev["code"] == 48
    _check_event(ev)
    ts, since_boot = line_time(prefix)
    assert ts is None or math.isfinite(ts)
    assert since_boot is None or 0 <= since_boot <= 100 * 366 * 86400


def test_a_megabyte_line_is_rejected_with_a_reason_and_the_next_line_still_parses(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    huge = "NVRM: Xid (PCI:0000:18:00): " + "7" * (1 << 20)
    log.write_text(huge + "\n" + "[5.0] NVRM: Xid (PCI:0000:18:00): 79, off the bus\n" + "x" * (1 << 20) + "\n")
    src = KmsgSource("gpu-node-001", log, from_start=True, drain=True, gpu_index_by_pci={"0000:18:00": 0})
    events = src.sample(NOW).events
    assert [e["code"] for e in events] == [79]
    assert src.problems == {f"line longer than {MAX_LINE_CHARS} characters": 1}
    assert parse_xid_line(huge).code is None  # the parser alone is bounded too


def test_invalid_utf8_and_lone_surrogates_still_give_events_that_encode(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_bytes(b"\xff\xfe[1.0] NVRM: Xid (PCI:0000:18:00): 13, \xc3\x28 bad \xed\xa0\x80 utf8\n")
    src = KmsgSource("gpu-node-001", log, from_start=True, drain=True)
    (ev,) = src.sample(NOW).events
    assert ev["code"] == 13
    _check_event(ev)
    ev = src.event("NVRM: Xid (PCI:0000:18:00): 31, \udcff\ud800 surrogates", NOW)
    assert ev["code"] == 31 and "\ud800" not in ev["message"]
    _check_event(ev)


def _mutate(rng: random.Random, line: str) -> str:
    """One random edit of a real line: digits spliced in, characters dropped, or any code points."""
    i = rng.randrange(len(line) + 1)
    r = rng.random()
    if r < 0.3:
        return line[:i] + "".join(rng.choice("0123456789") for _ in range(rng.choice([1, 5, 20, 400]))) + line[i:]
    if r < 0.5:
        return line[:i] + line[i + rng.randrange(1, 30):]
    if r < 0.8:
        return line[:i] + "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randrange(1, 10))) + line[i:]
    return line[:i] + rng.choice(["(PCI:", "): ", "NVRM: Xid (", "SXid (", "[", "]", ",", ";", ".", "-"]) + line[i:]


def test_fuzzed_real_lines_never_raise_and_every_event_fits_the_contract(shared_fixtures: Path,
                                                                         tmp_path: Path) -> None:
    import csv

    with open(shared_fixtures / "xid" / "xid_lines_real.tsv", newline="") as f:
        real = [row["raw_line"] for row in csv.DictReader(f, delimiter="\t")]
    prefixes = ["", "[ 12.345678] ", "4,1234,5678901,-;", "kern  :warn  : 2024-11-15T12:02:03,470068+00:00 ",
                "[Sun Feb 23 16:24:18 2025] ", "2024-11-15T12:02:03,470068+00:00 host kernel: "]
    rng = random.Random(20261203)
    src = _source(tmp_path)
    made = 0
    for _ in range(5000):
        line = rng.choice(prefixes) + rng.choice(real)
        for _ in range(rng.randrange(1, 4)):
            line = _mutate(rng, line)
        ev = src.event(line, NOW)
        if ev is not None:
            made += 1
            _check_event(ev)
    assert made > 2500  # most mutations leave an XID line: the events are really exercised


def test_random_bytes_through_the_file_follower_never_raise(tmp_path: Path) -> None:
    rng = random.Random(7)
    chunks = []
    for _ in range(3000):
        n = rng.choice([0, 1, 10, 100, 1000])
        chunk = bytes(rng.randrange(256) for _ in range(n))
        if rng.random() < 0.3:  # give the parser something to bite on
            chunk = b"NVRM: Xid (PCI:0000:18:00): " + str(rng.choice([48, 79, 2**40, 10**25])).encode() + chunk
        chunks.append(chunk)
    log = tmp_path / "kern.log"
    log.write_bytes(b"\n".join(chunks))
    src = KmsgSource("gpu-node-001", log, from_start=True, drain=True, gpu_index_by_pci={"0000:18:00": 0})
    events = src.sample(NOW).events
    assert events
    for ev in events:
        _check_event(ev)


def test_pci_names_that_are_not_hex_never_stop_the_gpu_index_map(tmp_path: Path) -> None:
    from collector.sources.base import normalize_pci_bus_id
    from collector.sources.kmsg import gpu_index_from_sysfs

    for name in ("0000:3b:00.0", "zzzz:3b:00.0", "\u0661\u0662:3b:00.0"):
        d = tmp_path / "bus/pci/devices" / name
        d.mkdir(parents=True)
        (d / "vendor").write_text("0x10de\n")
        (d / "class").write_text("0x030200\n")
    assert gpu_index_from_sysfs(tmp_path)["0000:3b:00"] == 0
    assert normalize_pci_bus_id("zzzz:3b:00.0") == "zzzz:3b:00"
