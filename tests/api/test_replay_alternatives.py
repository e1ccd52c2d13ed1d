"""``gpuops replay --compare-policy``: more policies decided on the same scores, in one replay."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from api.cli import build_cli
from api.replay import Replayer, build_report, headline
from models.bundle import load_default
from remediation.config import PolicyConfig


@pytest.fixture(scope="module")
def bundle():
    return load_default()


def test_an_alternative_decides_as_its_policy_would_alone_on_the_same_scores(small_recording, bundle):
    cfg = PolicyConfig()
    rules = cfg.model_copy(update={"use_model": False})
    res = Replayer(bundle, cfg, alternatives={"same": cfg, "rules": rules}).run(small_recording)
    assert res.decisions, "the recording must give the policy something to decide"
    assert res.alternatives["same"].decisions == res.decisions
    assert res.alternatives["rules"].decisions == res.baseline_decisions
    assert res.baseline_decisions != res.decisions
    assert Replayer(bundle, cfg).run(small_recording).decisions == res.decisions   # alternatives change nothing else


def test_the_report_puts_each_alternative_beside_the_policy_incident_by_incident(small_recording, bundle):
    cfg = PolicyConfig()
    res = Replayer(bundle, cfg, alternatives={"rules": cfg.model_copy(update={"use_model": False})}).run(
        small_recording)
    rep = build_report(small_recording, res, {}, cfg)
    alt, main = rep["alternatives"]["rules"], rep["metrics"]
    assert alt["policy"]["use_model"] is False
    assert alt["decisions"] == rep["baseline_decisions"]
    assert alt["metrics"]["caught"] == main["rules_baseline"]["caught"]
    vs = alt["against_policy"]
    # the same two sides as the report's own comparison, read the other way round
    assert vs["ahead_only_by_policy"] == main["comparison"]["ahead_only_by_model"]
    assert vs["caught_only_by_alternative"] == main["comparison"]["caught_only_by_baseline"]
    assert vs["ahead_only_by_policy"], "the model catches some incident ahead that the rules do not"
    assert vs["headline"]["recall"]["policy"] == main["model"]["recall"]
    assert headline(rep)["alternatives"]["rules"]["ahead_only_by_alternative"] == vs["ahead_only_by_alternative"]


def test_compare_policy_on_the_command_line_writes_the_alternatives_and_refuses_clashing_names(
        small_recording, tmp_path):
    (tmp_path / "rules").mkdir()
    only_rules = tmp_path / "rules" / "rules-only.yaml"
    only_rules.write_text("policy:\n  use_model: false\n")
    hbm_alert = tmp_path / "hbm-alert.yaml"
    hbm_alert.write_text("policy:\n  actions:\n    hbm_ecc: alert\n")
    res = CliRunner().invoke(build_cli(), ["replay", str(small_recording), "--report", str(tmp_path / "r.json"),
                                           "--html", str(tmp_path / "r.html"),
                                           "--compare-policy", str(only_rules), "--compare-policy", str(hbm_alert)])
    assert res.exit_code == 0, res.output
    rep = json.loads((tmp_path / "r.json").read_text())
    assert list(rep["alternatives"]) == ["rules-only", "hbm-alert"]
    assert rep["alternatives"]["rules-only"]["decisions"] == rep["baseline_decisions"]
    def hbm_drains(decisions):
        return [d for d in decisions if d["source"] == "model" and d["fault"] == "hbm_ecc"
                and d["action"] in ("drain", "reset")]

    assert hbm_drains(rep["decisions"]) and not hbm_drains(rep["alternatives"]["hbm-alert"]["decisions"])
    # the HBM failures the default policy drained ahead of, the alternative leaves to the rules at the failure
    assert rep["alternatives"]["hbm-alert"]["against_policy"]["ahead_only_by_policy"]
    assert not rep["alternatives"]["hbm-alert"]["against_policy"]["ahead_only_by_alternative"]
    assert '"alternatives"' in res.output and "hbm-alert" in res.output
    page = (tmp_path / "r.html").read_text()
    assert "Policies compared" in page and "hbm-alert" in page

    (tmp_path / "again").mkdir()
    (tmp_path / "again" / "hbm-alert.yaml").write_text("policy: {}\n")
    clash = CliRunner().invoke(build_cli(), ["replay", str(small_recording), "--report", str(tmp_path / "r2.json"),
                                             "--compare-policy", str(hbm_alert),
                                             "--compare-policy", str(tmp_path / "again" / "hbm-alert.yaml")])
    assert clash.exit_code == 2 and "two policy files named 'hbm-alert'" in clash.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy:\n  act_threshold: 2\n")
    refused = CliRunner().invoke(build_cli(), ["replay", str(small_recording), "--report", str(tmp_path / "r3.json"),
                                               "--compare-policy", str(bad)])
    assert refused.exit_code == 2 and "act_threshold" in refused.output
    assert not (tmp_path / "r2.json").exists() and not (tmp_path / "r3.json").exists()


def test_without_incidents_the_summary_counts_what_each_alternative_would_have_done():
    report = {"decisions": [], "summary": {"gpu_samples_per_s": 1},
              "alternatives": {"strict": {"decisions": [{"action": "drain"}, {"action": "alert"}, {"action": "drain"}]},
                               "quiet": {"decisions": []}}}
    assert headline(report)["alternatives"] == {"strict": {"decisions": 3, "actions": {"drain": 2, "alert": 1}},
                                                "quiet": {"decisions": 0, "actions": {}}}


def test_the_report_carries_each_policys_false_action_budget_hold_by_hold(small_recording, bundle):
    cfg = PolicyConfig()
    res = Replayer(bundle, cfg, alternatives={"off": cfg.model_copy(update={"false_budget_per_1k_node_days": 0})}
                   ).run(small_recording)
    rep = build_report(small_recording, res, {}, cfg)
    fb = rep["false_budget"]
    assert fb["holds"], "the recording's predictions take nodes out and their holds end"
    by_node: dict[str, list[dict]] = {}
    for d in rep["decisions"]:
        by_node.setdefault(d["node"], []).append(d)
    for ts, node, fault, confirmed, since, by in fb["holds"]:
        took = [d for d in by_node[node] if d["ts"] == since and d["source"] == "model"]
        assert [(d["action"] in ("drain", "reset"), d["fault"]) for d in took] == [(True, fault)]
        ended = [d for d in by_node[node] if d["ts"] == ts]
        assert any(d["source"] == "rule" for d in ended) if confirmed else any(d["action"] == "resume" for d in ended)
        assert by == "policy"
    counted = {f: sum(1 for h in fb["holds"] if h[2] == f) for f in fb["outcomes"]}
    assert counted == {f: c["unconfirmed"] + c["confirmed"] for f, c in fb["outcomes"].items()}
    assert rep["alternatives"]["off"]["false_budget"]["holds"] == []    # off: nothing counted
