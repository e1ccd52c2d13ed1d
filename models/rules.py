"""The reactive baseline: XID-catalogue and hard-threshold rules.

This is what NVSentinel, NHC and DCGM health watches do today: act when a fatal XID
appears or a counter crosses a hard limit. Rules are data (:data:`DEFAULT_RULES`),
validated against the feature names when the detector is built; each fires on one
feature crossing a threshold and names a fault class, an action and a reason. The
first rule that fires on a row wins (order = priority).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from collector.schema import Action, FaultClass, FollowUp

from .base import Detector, DetectorOutput, FeatureMismatch, class_index


@dataclass(frozen=True)
class Rule:
    """``feature > threshold`` (or ``>=``) means ``fault`` now; remedy ``action``."""

    name: str
    feature: str
    threshold: float
    fault: FaultClass
    action: Action
    reason: str  # format string; ``{value}`` is the feature value
    inclusive: bool = False
    #: what the drain leads to once the node is idle (None: nothing more)
    follow_up: FollowUp | None = None

    def fires(self, col: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return (col >= self.threshold) if self.inclusive else (col > self.threshold)


_F, _A = FaultClass, Action
#: Default rules, in priority order. XID classes come from the catalogue (models.xid).
DEFAULT_RULES: tuple[Rule, ...] = (
    Rule("xid_off_bus", "xid_off_bus_count_short", 0, _F.GPU_OFF_BUS, _A.DRAIN,
         "XID 79: GPU has fallen off the bus ({value:.0f} in the short window)"),
    Rule("row_remap_failure", "row_remap_failure", 0, _F.HBM_ECC, _A.DRAIN,
         "HBM row remap failure: no spare rows left"),
    Rule("ecc_dbe", "ecc_dbe_per_h_short", 0, _F.HBM_ECC, _A.RESET,
         "uncorrectable (double-bit) ECC errors: {value:.0f}/h"),
    Rule("xid_hbm", "xid_hbm_count_short", 0, _F.HBM_ECC, _A.RESET,
         "HBM ECC XIDs (48/63/64/94/95): {value:.0f} in the short window"),
    Rule("xid_nvlink", "xid_nvlink_count_short", 0, _F.NVLINK, _A.DRAIN,
         "XID 74: NVLink error ({value:.0f} in the short window)"),
    Rule("ib_link_down", "net_link_downed_per_min_short", 0, _F.IB_LINK, _A.DRAIN,
         "InfiniBand link went down ({value:.2f}/min)"),
    Rule("ib_port_not_active", "net_ports_not_active_frac_short", 0, _F.IB_LINK, _A.DRAIN,
         "InfiniBand port not ACTIVE ({value:.0%} of port samples)"),
    Rule("hw_thermal", "throttle_hw_thermal_frac_short", 0.5, _F.THERMAL, _A.DRAIN,
         "hardware thermal slowdown {value:.0%} of the time"),
    Rule("hw_power_brake", "throttle_hw_power_brake_frac_short", 0.5, _F.POWER, _A.DRAIN,
         "hardware power brake {value:.0%} of the time"),
    Rule("pcie_replay_storm", "pcie_replay_per_min_short", 1000, _F.PCIE, _A.DRAIN,
         "PCIe replay storm: {value:.0f}/min"),
)


class RulesDetector(Detector):
    """Scores 1.0 where a rule fires (with its fault, action and reason), else 0."""

    kind = "rules"

    def __init__(self, feature_names: Sequence[str], rules: Sequence[Rule] = DEFAULT_RULES):
        super().__init__(feature_names)
        missing = [r.feature for r in rules if r.feature not in self.feature_names]
        if missing:
            raise FeatureMismatch(f"rules refer to unknown features: {missing}")
        self.rules = tuple(rules)
        self._cols = [self.feature_names.index(r.feature) for r in rules]
        self.fitted = True  # rules need no training

    def _fit(self, x: np.ndarray, y: np.ndarray | None, *, sample_weight: np.ndarray | None, **kw: Any) -> None:
        return None

    def _score(self, x: np.ndarray) -> DetectorOutput:
        n = len(x)
        rule = np.full(n, -1, np.int16)
        for k in range(len(self.rules) - 1, -1, -1):  # last assignment wins: iterate lowest priority first
            rule[self.rules[k].fires(x[:, self._cols[k]])] = k
        fault = np.zeros(n, np.int8)
        hit = rule >= 0
        if hit.any():
            fault_of_rule = np.array([class_index(r.fault) for r in self.rules], np.int8)
            fault[hit] = fault_of_rule[rule[hit]]
        return DetectorOutput(hit.astype(np.float32), fault, {"rule": rule})

    def reason(self, rule_index: int, row: np.ndarray) -> str:
        """The human reason of rule *rule_index* on one feature row."""
        r = self.rules[rule_index]
        return r.reason.format(value=float(row[self._cols[rule_index]]))

    def action(self, rule_index: int) -> Action:
        return self.rules[rule_index].action

    def follow_up(self, rule_index: int) -> FollowUp | None:
        return self.rules[rule_index].follow_up

    def get_state(self) -> dict[str, Any]:
        return {"rules": [asdict(r) | {"fault": r.fault.value, "action": r.action.value,
                                     "follow_up": r.follow_up.value if r.follow_up else None} for r in self.rules]}

    def set_state(self, state: dict[str, Any]) -> None:
        rules = [Rule(**(r | {"fault": FaultClass(r["fault"]), "action": Action(r["action"]),
                              "follow_up": FollowUp(r["follow_up"]) if r.get("follow_up") else None}))
                 for r in state["rules"]]
        self.__init__(self.feature_names, rules)  # type: ignore[misc]
