"""The dcgm-exporter source against a real scrape, the spec's field table and a live HTTP endpoint."""

from __future__ import annotations

import http.server
import re
import threading
from pathlib import Path
from typing import Iterator

import pytest

from collector.schema import RecordType, validate_record
from collector.sources.base import PermanentSourceError, TransientSourceError
from collector.sources.dcgm import DCGM_FIELDS, DcgmSource, missing_signals, parse_exposition, scrape_to_rows

REPO = Path(__file__).resolve().parents[2]


def _scrape(root: Path) -> Path:
    return root / "dcgm_exporter" / "scrapes" / "datadog_dcgm_fixture_metrics.txt"


def _gpu0_values(text: str) -> dict[str, float]:
    """Independent of the parser: last token of each line whose labels start with gpu="0"."""
    return {line.split("{", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith("DCGM_FI_") and '{gpu="0"' in line}


def test_real_scrape_maps_every_exported_field_to_its_column(shared_fixtures: Path) -> None:
    path = _scrape(shared_fixtures)
    rows = DcgmSource("gpu-node-001", str(path)).sample(1767225600.0).gpu
    assert len(rows) == 1
    row = rows[0]
    assert validate_record(row, RecordType.GPU) is None
    assert (row["gpu"], row["gpu_uuid"], row["node"]) == (0, "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e", "gpu-node-001")
    exported = _gpu0_values(path.read_text())
    mapped = {DCGM_FIELDS[k]: v for k, v in exported.items() if k in DCGM_FIELDS}
    assert len(mapped) >= 12
    for col, value in mapped.items():
        assert row[col] == value, col
    assert (row["power_w"], row["fb_free_mib"], row["sm_clock_mhz"], row["xid_last"]) == (8.969, 15109, 300, 0)


def test_series_without_a_gpu_label_and_unexported_fields_stay_null(shared_fixtures: Path) -> None:
    row = DcgmSource("n", str(_scrape(shared_fixtures))).sample(0.0).gpu[0]
    # the fixture's dummy DCGM_FI_DEV_MEMORY_TEMP has no labels at all: not a GPU's value
    assert row["temp_mem_c"] is None and row["remapped_rows_uncorr"] is None
    assert row["ecc_dbe_vol"] is None and row["nvlink_crc_flit_err"] is None


def test_every_dcgm_field_of_the_spec_table_is_mapped_to_its_column(shared_fixtures: Path) -> None:
    spec = shared_fixtures.parent / "spec" / "telemetry.md"  # skips locally / fails in CI with the fixtures
    section = spec.read_text().split("## 1.", 1)[1].split("## 2.", 1)[0]
    pairs = re.findall(r"^\| (\w+) \|[^|]*\|[^|]*\| (DCGM_FI_\w+)", section, re.M)
    assert len(pairs) >= 28
    for column, field in pairs:
        assert DCGM_FIELDS.get(field) == column, field


def test_several_gpus_are_ordered_and_a_whole_gpu_series_beats_a_mig_instance_one() -> None:
    text = "\n".join([
        '# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).',
        'DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-b",GPU_I_ID="3"} 71',
        'DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-b"} 70',
        'DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-b",GPU_I_ID="4"} 72',
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",pod="p \\"quoted\\""} 50',
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",pod="other"} 99',
        'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-a"} NaN',
        'DCGM_FI_DEV_CLOCKS_EVENT_REASONS{gpu="0",UUID="GPU-a"} 64',
        'DCGM_FI_DEV_XID_ERRORS{gpu="1",UUID="GPU-b",err_code="79"} 79 1700000000000',
    ])
    rows = scrape_to_rows(text, "n", 5.0)
    assert [(r["gpu"], r["gpu_uuid"], r["temp_gpu_c"]) for r in rows] == [(0, "GPU-a", 50), (1, "GPU-b", 70)]
    assert rows[0]["power_w"] is None and rows[0]["throttle_reasons"] == 64 and rows[1]["xid_last"] == 79


def test_exposition_parser_reads_escaped_labels_and_skips_comments() -> None:
    got = list(parse_exposition('# TYPE x gauge\nx{a="1\\"2",b="c"} 3.5\n\nbad line\ny 4e3 123\n'))
    assert got == [("x", {"a": '1"2', "b": "c"}, 3.5), ("y", {}, 4000.0)]


@pytest.fixture()
def exporter(shared_fixtures: Path) -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 serving the captured scrape at /metrics."""
    body = _scrape(shared_fixtures).read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server API
            code = 200 if self.path == "/metrics" else 404
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            if code == 200:
                self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_scraping_a_live_endpoint_gives_the_same_row_as_the_file(exporter: str, shared_fixtures: Path) -> None:
    live = DcgmSource("n", exporter + "/metrics").sample(1.0).gpu
    saved = DcgmSource("n", str(_scrape(shared_fixtures))).sample(1.0).gpu
    assert live == saved and len(live) == 1


def test_exporter_that_does_not_answer_is_a_transient_error(exporter: str) -> None:
    with pytest.raises(TransientSourceError, match="404"):
        DcgmSource("n", exporter + "/nothing-here").sample(1.0)
    with pytest.raises(TransientSourceError):
        DcgmSource("n", "http://127.0.0.1:9/metrics", timeout_s=0.5).sample(1.0)


def test_missing_scrape_file_fails_at_start(tmp_path: Path) -> None:
    with pytest.raises(PermanentSourceError, match="--dcgm-url"):
        DcgmSource("n", str(tmp_path / "absent.txt"))


def test_values_and_gpu_labels_no_column_can_hold_are_null_or_ignored_and_never_raise() -> None:
    text = "\n".join([
        'DCGM_FI_DEV_GPU_UTIL{gpu="0"} 50',
        'DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu="0"} 1e30',  # int64 column
        'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 1e300',  # float32 column
        'DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{gpu="0"} 1e300',  # float64 column: held
        'DCGM_FI_DEV_POWER_USAGE{gpu="0"} +Inf',
        'DCGM_FI_DEV_GPU_UTIL{gpu="99999999999999999999"} 1',  # int16 gpu column
        'DCGM_FI_DEV_GPU_UTIL{gpu="32768"} 1',
        'DCGM_FI_DEV_GPU_UTIL{gpu="\u00b2"} 1',  # "²".isdigit(), but int("²") raises
        'DCGM_FI_DEV_GPU_UTIL{gpu="1"} 99999999999999999999999',
    ])
    rows = scrape_to_rows(text, "gpu-node-001", 1767225600.0)
    assert [r["gpu"] for r in rows] == [0, 1]
    r0, r1 = rows
    assert (r0["util_gpu"], r0["throttle_reasons"], r0["temp_gpu_c"], r0["ecc_sbe_vol"], r0["power_w"]) == \
        (50.0, None, None, 1e300, None)
    assert r1["util_gpu"] == 1e23
    for r in rows:
        assert validate_record(r, RecordType.GPU) is None


def test_a_real_scrape_without_ecc_or_nvlink_error_counters_is_named_once_with_the_fields_to_enable(
        shared_fixtures: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    src = DcgmSource("n", str(_scrape(shared_fixtures)))
    with caplog.at_level("WARNING", logger="collector.sources.dcgm"):
        src.sample(1.0)
        src.sample(2.0)
    assert src.missing == ("ecc", "nvlink")        # the real scrape: throttle, PCIe, power, clocks are there
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "sends no ecc, nvlink counters" in warned[0]
    assert "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" in warned[0] and "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL" in warned[0]
    full = tmp_path / "full.txt"
    full.write_text(_scrape(shared_fixtures).read_text() + "\n" + "".join(
        f'{f}{{gpu="{g}",UUID="GPU-{g}"}} 0\n' for f in ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                                                          "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL") for g in (0,)))
    assert DcgmSource("n", str(full)).sample(1.0) and missing_signals(scrape_to_rows(full.read_text(), "n", 1.0)) == ()
    assert missing_signals([]) == ()


def test_the_agents_health_record_names_the_signals_its_exporter_does_not_send(shared_fixtures: Path) -> None:
    from api.commands.agent import compose_agent
    from collector.agent_settings import AgentSettings

    settings = AgentSettings(node="n", sources="dcgm", sink="stdout", health_file=None,
                             dcgm_url=str(_scrape(shared_fixtures)))
    agent = compose_agent(settings, once=True)
    try:
        assert agent.health()["dcgm"] == {"missing_signals": None}
        agent.sources[0].sample(1.0)
        assert agent.health()["dcgm"] == {"missing_signals": ["ecc", "nvlink"]}
    finally:
        agent.close()
