"""The HTML replay report: self-contained, shows the key numbers, escapes what it shows."""

from __future__ import annotations

import base64
import re
import sys

import numpy as np
import pytest

import matplotlib  # noqa: F401  (the `test` extra installs it: these tests render the plots)

from models.evaluation import compare, score_replay
from api.report_html import write_html_report

F = 50_000.0
EVIL = "<script>alert('x')</script>$\\x$"


def _report(missed_node="n-c"):
    incidents = [
        {"id": "inc-1", "node": "n-a", "gpu": 1, "fault": "hbm_ecc", "onset_ts": F - 7200,
         "failure_ts": F, "predictable": True},
        {"id": "inc-2", "node": "n-b", "gpu": None, "fault": "ib_link", "onset_ts": F - 3000,
         "failure_ts": F + 100, "predictable": True},
        {"id": "inc-3", "node": missed_node, "gpu": 0, "fault": "gpu_off_bus", "onset_ts": None,
         "failure_ts": F + 500, "predictable": False},
        {"id": "inc-4", "node": "n-d", "gpu": 2, "fault": "app_error", "onset_ts": None,
         "failure_ts": F + 900, "predictable": False},
    ]
    model = [
        {"ts": F - 1800, "node": "n-a", "gpu": 1, "action": "drain", "fault": "hbm_ecc", "score": 0.93,
         "reason": "SBE rate 40/h"},
        {"ts": F - 600, "node": "n-b", "gpu": None, "action": "drain", "fault": "ib_link", "score": 0.8,
         "reason": "symbol errors rising"},
        {"ts": F - 50, "node": "n-e", "gpu": 3, "action": "alert", "fault": "thermal", "score": 0.5,
         "reason": "hot"},
        {"ts": F + 10, "node": "n-z", "gpu": 3, "action": "reset", "fault": "power", "score": 0.7,
         "reason": "spurious <b>rising</b>"},
    ]
    base = [
        {"ts": F + 30, "node": "n-a", "gpu": 1, "action": "reset", "fault": "hbm_ecc", "score": 1.0,
         "reason": "XID 48"},
        {"ts": F + 900, "node": missed_node, "gpu": 0, "action": "drain", "fault": "gpu_off_bus", "score": 1.0,
         "reason": "XID 79"},
    ]
    kw = dict(node_days=20.0, gpus_per_node=8)
    m, b = score_replay(model, incidents, **kw), score_replay(base, incidents, **kw)
    return {"recording": "/data/rec-<1>", "decisions": model, "baseline_decisions": base,
            "incidents": incidents, "summary": {"samples_per_s": 312345.6},
            "metrics": {"model": m, "rules_baseline": b, "comparison": compare(m, b)}}


def test_the_report_renders_to_one_file_with_the_key_numbers_and_embedded_plots(tmp_path):
    out = write_html_report(_report(), tmp_path / "r.html")
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "66.7%" in page          # model recall: 2 of 3 node faults
    assert "33.3%" in page          # baseline recall: 1 of 3 (the reset on n-a comes 30 s after)
    assert "20.8 min" in page       # model's median lead: leads 1800 s and 700 s
    assert "<td>50.0</td>" in page  # false actions per 1,000 node-days: 1 / 20 node-days
    assert "Alerts / 1,000 node-days" in page
    assert "<h2>Decisions by evidence</h2>" in page and "<td>unknown</td><td>2 / 1</td>" in page  # drains: model / rules
    assert "inc-3" in page          # a missed incident is listed
    assert "spurious" in page       # the false action is listed
    imgs = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)" alt="[^"<>]*">', page)
    assert len(imgs) == 3 and page.count("<img") == 3
    for data in imgs:
        assert base64.b64decode(data).startswith(b"\x89PNG\r\n\x1a\n")
    assert "http://" not in page and "https://" not in page and "<link" not in page


def test_a_malicious_node_name_is_escaped_in_the_page(tmp_path):
    page = write_html_report(_report(missed_node=EVIL), tmp_path / "r.html").read_text(encoding="utf-8")
    assert "<script>" not in page and "<b>rising" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "/data/rec-&lt;1&gt;" in page and page.count("<img") == 3   # the plots survived the name


def test_a_report_without_ground_truth_still_draws_the_decisions(tmp_path):
    report = _report()
    del report["metrics"], report["incidents"]
    page = write_html_report(report, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "metrics unavailable" in page and page.count("<img") == 1


def test_a_missing_matplotlib_names_the_extra_to_install(tmp_path, monkeypatch):
    for mod in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"pip install gpuops\[report\]"):
        write_html_report(_report(), tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()


def test_the_verdict_comes_first_and_the_run_statistics_last_in_words(tmp_path):
    report = _report()
    report["summary"] = {"gpu_samples": 1_447_742, "cadence_s": 60.0, "held_at_end": ["n-a", "n-b"],
                         "wall_s": 9.71, "stage_cpu_s": {"read": 1.94, "scoring": 3.2},
                         "gpu_samples_per_s": 149_695.4, "state_bytes": 26_237_952, "suppressed_by_cause": {},
                         "samples_per_s": 312_345.6}
    page = write_html_report(report, tmp_path / "r.html").read_text(encoding="utf-8")
    glance = page.index('<p class="muted">20.0 node-days; 1,447,742 GPU samples; 3 node-fault incidents')
    assert glance < page.index("<h2>Model vs rules baseline</h2>") < page.index("<h2>The replay run</h2>")
    assert "held at the end: n-a, n-b." in page
    run = page[page.index("<h2>The replay run</h2>"):]
    assert "<td>wall time</td><td>9.7 s</td>" in run
    assert "<td>CPU time by stage</td><td>read 1.9 s, scoring 3.2 s</td>" in run
    assert "<td>GPU samples per wall second</td><td>149,695</td>" in run   # a rate, not minutes
    assert "<td>samples_per_s</td><td>312,346</td>" in run                  # an unknown rate: its key, as a number
    assert "<td>window state in memory</td><td>25.0 MiB</td>" in run
    assert "<td>decisions held back, by cause</td><td>none</td>" in run


def test_the_false_action_budget_shows_how_prediction_holds_ended_and_what_it_braked(tmp_path):
    rep = _report()
    rep["false_budget"] = {"per_1k_node_days": 5.0, "node_days": 20.0, "window_s": 604800.0,
                           "outcomes": {"hbm_ecc": {"unconfirmed": 3, "confirmed": 1}},
                           "braked": {"hbm_ecc": "braked: 3 of this fleet's <hbm_ecc> holds ended healthy"}}
    page = write_html_report(rep, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "<h2>False-action budget</h2>" in page
    assert "<td>hbm_ecc</td><td>3</td><td>1</td><td>braked: 3 of this fleet&#x27;s &lt;hbm_ecc&gt;" in page
    rep["false_budget"] = {**rep["false_budget"], "outcomes": {}, "braked": {}}
    assert "No hold taken on a prediction ended" in write_html_report(rep, tmp_path / "r2.html").read_text()
    del rep["false_budget"]
    assert "False-action budget" not in write_html_report(rep, tmp_path / "r3.html").read_text()


def test_the_signals_nodes_did_not_send_are_listed_with_what_to_enable_and_the_incidents_there(tmp_path):
    from models.coverage import CoverageTally, bits_of

    tally = CoverageTally()
    for _ in range(3):
        tally.add(np.array(["n-a", EVIL], object), np.array([bits_of(["ecc"]), bits_of(["nvlink"])]))
    report = _report() | {"coverage": tally.report(_report()["incidents"])}
    page = write_html_report(report, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "<h2>Signals not sent</h2>" in page and "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" in page
    assert "inc-1 (hbm_ecc on n-a)" in page and "<script>" not in page        # the node name escaped
    report["coverage"] = CoverageTally().report([])
    assert "sent every precursor signal" in write_html_report(report, tmp_path / "r.html").read_text(encoding="utf-8")
