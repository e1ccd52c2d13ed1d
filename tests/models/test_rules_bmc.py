"""BMC rules: the exact SEL classes and the BMC's own thresholds act on the node, missing data never
fires, and on a simulated fleet they fire before power and thermal failures and never on healthy nodes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from collector.recording import open_recording
from collector.schema import Action, FaultClass, Grade
from collector.simulator import SimConfig, simulate_recording
from collector.simulator.config import DEFAULT_PREDICTABLE
from models.bundle import ModelBundle
from models.node_scores import aggregate, score_batches
from models.rules import DEFAULT_RULES, RulesDetector
from pipeline.features import FEATURE_NAMES
from pipeline.recordings import RECORDING_COLUMNS
from pipeline.settings import PipelineSettings
from pipeline.stream import FeaturePipeline
from remediation.config import PolicyConfig
from remediation.policy import PolicyState, decide

BMC_RULES = {r.name for r in DEFAULT_RULES if r.feature.startswith("node_bmc_")}
RULES_JSON = Path(__file__).resolve().parents[2] / "models" / "default" / "rules.json"


def _score(values: dict[str, float]) -> str | None:
    """The rule that fires on one row holding *values* (every other feature NaN: unknown)."""
    x = np.full((1, len(FEATURE_NAMES)), np.nan, np.float32)
    for name, v in values.items():
        x[0, FEATURE_NAMES.index(name)] = v
    r = RulesDetector(FEATURE_NAMES)
    k = int(r.score(x).detail["rule"][0])
    return None if k < 0 else r.rules[k].name


@pytest.mark.parametrize("feature,value,rule,fault,action", [
    ("node_bmc_psu_fail_count_short", 1, "bmc_psu_fail", FaultClass.POWER, Action.DRAIN),
    ("node_bmc_psu_predictive_count_short", 1, "bmc_psu_predictive", FaultClass.POWER, Action.ALERT),
    ("node_bmc_fan_fail_count_short", 1, "bmc_fan_fail", FaultClass.THERMAL, Action.DRAIN),
    ("node_bmc_temp_critical_count_short", 2, "bmc_temp_critical", FaultClass.THERMAL, Action.DRAIN),
    ("node_bmc_inlet_margin_c", 0.0, "bmc_inlet_critical", FaultClass.THERMAL, Action.DRAIN),
    ("node_bmc_inlet_margin_c", -3.0, "bmc_inlet_critical", FaultClass.THERMAL, Action.DRAIN),
    ("node_bmc_fan_margin_rpm", -1000.0, "bmc_fan_critical", FaultClass.THERMAL, Action.DRAIN),
])
def test_each_bmc_signal_fires_its_node_rule(feature, value, rule, fault, action):
    assert _score({feature: value}) == rule
    r = next(r for r in DEFAULT_RULES if r.name == rule)
    assert (r.fault, r.action, r.on_node) == (fault, action, True)
    assert "BMC" in r.reason and ("threshold" in r.reason or "'" in r.reason)


@pytest.mark.parametrize("values", [
    {}, {"node_bmc_inlet_margin_c": 0.5, "node_bmc_fan_margin_rpm": 1.0},
    {"node_bmc_psu_fail_count_short": 0, "node_bmc_fan_fail_count_short": 0, "node_bmc_psu_fail_count_long": 3},
])
def test_bmc_rules_never_fire_on_missing_data_or_with_margin_left(values):
    assert _score(values) is None


def test_the_shipped_models_rules_are_the_default_rules():
    r = RulesDetector(FEATURE_NAMES)
    r.set_state(json.loads(RULES_JSON.read_text()))
    assert r.rules == DEFAULT_RULES


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """A small fleet with power and thermal incidents, replayed through features, rules and policy."""
    out = tmp_path_factory.mktemp("bmc") / "rec"
    cfg = SimConfig(nodes=16, hours=8, seed=11, rate_multiplier=250,
                    mix={FaultClass.POWER: 1.0, FaultClass.THERMAL: 1.0},
                    predictable=DEFAULT_PREDICTABLE | {FaultClass.POWER: 1.0})
    simulate_recording(cfg, out)
    rec = open_recording(out)
    pipe = FeaturePipeline(PipelineSettings())
    bundle = ModelBundle.rules_only()
    names = [r.name for r in bundle.rules.rules]
    fired, decisions, state = [], [], PolicyState()
    for batch in pipe.replay(rec.iter_windows(1800, align=60, columns=RECORDING_COLUMNS)):
        (sc,) = score_batches(bundle, [batch])
        ns = aggregate(batch, sc, bundle.rules)
        fired += [(batch.ts, node, names[k]) for node, k in zip(ns.node, ns.rule) if k >= 0]
        d, state = decide(ns, state, batch.ts, PolicyConfig(model_warmup_s=0), lambda i, source: source)
        decisions += [(batch.ts, x) for x in d]
    return rec.incidents(), pd.DataFrame(fired, columns=["ts", "node", "rule"]), decisions


def test_on_a_simulated_fleet_bmc_rules_fire_before_power_and_thermal_failures(replayed):
    incidents, fired, decisions = replayed
    warned = [i for i in incidents if i["onset_ts"] is not None]
    assert {i["fault"] for i in warned} == {"power", "thermal"}
    leads = []
    for i in warned:
        mine = fired[(fired["node"] == i["node"]) & fired["rule"].isin(BMC_RULES)
                     & (fired["ts"] >= i["onset_ts"]) & (fired["ts"] <= i["failure_ts"])]
        assert len(mine), i
        leads.append(i["failure_ts"] - mine["ts"].min())
        before = [d for ts, d in decisions if d.node == i["node"] and i["onset_ts"] <= ts <= i["failure_ts"]]
        drains = [d for d in before if d.action is Action.DRAIN]
        assert drains and drains[0].grade is Grade.CERTAIN, i  # the BMC's, or a GPU rule that fired first
        # a supply's predictive failure tells a person about the node (no GPU), it does not drain
        alerts = [d for d in before if d.action is Action.ALERT]
        assert all(d.gpu is None and d.fault is FaultClass.POWER for d in alerts), alerts
    assert min(leads) > 0
    node_drains = [d for _, d in decisions if d.action is Action.DRAIN and d.gpu is None]
    assert node_drains  # some failure was first seen by the BMC alone: the drain names the node


def test_on_a_simulated_fleet_no_bmc_rule_fires_on_a_healthy_node(replayed):
    incidents, fired, _ = replayed
    sick = {i["node"] for i in incidents}
    bmc = fired[fired["rule"].isin(BMC_RULES)]
    assert len(bmc) and set(bmc["node"]) <= sick


@pytest.mark.bmc
def test_a_real_bmcs_psu_failure_and_redfish_intake_reading_reach_the_rules_through_the_pipeline(bmc, tmp_path):
    """ipmi_sim's SEL holds a power supply 'Failure detected' entry; sushy-emulator's chassis read intake air."""
    from collector.sources.ipmi import IpmiSource
    from collector.sources.redfish import RedfishSource

    pw = Path(bmc["passfile"]).read_text().strip()
    now = 1_767_225_630.0
    state = tmp_path / "sel.json"
    state.write_text('{"last_sel_id": 0}')  # the agent was reading this SEL before the entry came (not an install)
    ipmi = IpmiSource("gpu-node-001", bmc["ipmi_host"], int(bmc["ipmi_port"]), bmc["user"], pw,
                      state).sample(now).events
    redfish = RedfishSource("gpu-node-001", bmc["redfish"]).sample(now).events
    assert all(e["ts"] == now for e in ipmi if e["kind"] == "sel")  # read now, whatever the BMC's clock says
    gpu = pd.DataFrame({"ts": now - 25.0 + 10.0 * np.arange(3).repeat(2), "node": "gpu-node-001",
                        "gpu": np.tile([0, 1], 3).astype(np.int16), "util_gpu": 50.0, "throttle_reasons": 0.0})
    pipe = FeaturePipeline(PipelineSettings())
    pipe.ingest_frames(gpu, None, pd.DataFrame(ipmi + redfish))
    (batch,) = pipe.flush()
    f = batch.to_frame().iloc[0]
    assert f["node_bmc_psu_fail_count_short"] >= 1
    intake = [e for e in redfish if e["sensor_type"] == "temperature" and "Intake" in e["sensor"]]
    assert f["node_bmc_inlet_margin_c"] == min(e["upper_critical"] - e["value"] for e in intake)
    bundle = ModelBundle.rules_only()
    (sc,) = score_batches(bundle, [batch])
    ns = aggregate(batch, sc, bundle.rules)
    assert bundle.rules.rules[int(ns.rule[0])].name == "bmc_psu_fail" and ns.rule_gpu[0] == -1
