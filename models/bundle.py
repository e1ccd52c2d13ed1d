"""A trained model set (rules + anomaly + classifier) and its artifact directory.

A saved model is a directory::

    model.json      format, version, feature names, training metadata (recordings, split, seed), and
                    any inputs a detector reads as a constant (``held_inputs``, see :meth:`Detector.hold`)
    metrics.json    validation metrics measured at training time
    rules.json      the rules (data, readable)
    anomaly.joblib  the anomaly detector's parameters
    classifier.joblib

Loading checks the format version, that every feature the detectors read is one the
pipeline computes (by name: features appended later do not break a model), that the
pipeline's windows and cadence are the ones the model was trained with, and that the
installed scikit-learn is the one that saved the trees (``models/treeeval.py`` reads
private attributes of its estimators). Each mismatch fails at start-up with what to do.
``*.joblib`` files are pickles: load models only from directories you trust, as with any
scikit-learn model.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

import joblib
import numpy as np
import sklearn
from threadpoolctl import ThreadpoolController

from pipeline.features import FEATURE_NAMES
from pipeline.settings import PipelineSettings

from .anomaly import AnomalyDetector
from .base import FeatureMismatch, ModelError, ModelNotFitted
from .classifier import FailureClassifier
from .inputs import exclusion_reason
from .rules import RulesDetector

FORMAT = "gpuops-model"
VERSION = 2
#: Pipeline settings a model's features depend on: a model is only valid with the same ones.
PIPELINE_KEYS = ("cadence_s", "bucket_s", "short_window_s", "long_window_s")


def pipeline_signature(settings: PipelineSettings | None = None) -> dict[str, float]:
    """The windows and cadence of *settings* that a trained model depends on."""
    s = settings or PipelineSettings()
    return {k: float(getattr(s, k)) for k in PIPELINE_KEYS}


@dataclass
class ScoreBatch:
    """Every detector's verdict on the rows of one feature matrix."""

    p_fail: np.ndarray       # calibrated P(node fault within the horizon), (R,)
    fault: np.ndarray        # classifier's fault class index, (R,)
    rule: np.ndarray         # index of the rule that fired, -1 if none, (R,)
    rule_fault: np.ndarray   # fault class index of that rule, (R,)
    anomaly: np.ndarray      # calibrated anomaly level in [0, 1], (R,)
    #: index of the rule whose condition held but a veto stopped (a shared cause), -1 if none, (R,)
    rule_vetoed: np.ndarray | None = None

    def take(self, idx: np.ndarray) -> "ScoreBatch":
        return ScoreBatch(*(a[idx] for a in (self.p_fail, self.fault, self.rule, self.rule_fault, self.anomaly)),
                          rule_vetoed=None if self.rule_vetoed is None else self.rule_vetoed[idx])


@dataclass
class ModelBundle:
    """The detectors gpuops scores with, and what is known about how they were made."""

    rules: RulesDetector
    classifier: FailureClassifier | None = None
    anomaly: AnomalyDetector | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    #: OpenMP/BLAS threads while scoring. 1: their pools busy-wait, and on a node whose other
    #: cores are busy that made scikit-learn's scoring 36x slower here (88 s vs 2.4 s); scale
    #: out with more scoring workers in the consumer group instead.
    score_threads: int = 1

    @property
    def feature_names(self) -> tuple[str, ...]:
        return self.rules.feature_names

    @classmethod
    def rules_only(cls, feature_names: Sequence[str] = FEATURE_NAMES) -> "ModelBundle":
        """The reactive baseline alone (no trained models)."""
        return cls(RulesDetector(feature_names))

    def score(self, x: np.ndarray) -> ScoreBatch:
        """Score a whole feature matrix (chunked inside each detector)."""
        with _threadpools().limit(limits=self.score_threads):
            return self._score(x)

    def _score(self, x: np.ndarray) -> ScoreBatch:
        r = self.rules.score(x)
        n = len(x)
        if self.classifier is not None:
            c = self.classifier.score(x)
            p, fault = c.p, c.fault
        else:
            p, fault = np.zeros(n, np.float32), np.zeros(n, np.int8)
        a = self.anomaly.score(x).p if self.anomaly is not None else np.zeros(n, np.float32)
        return ScoreBatch(p, fault, r.detail["rule"], r.fault, a, rule_vetoed=r.detail.get("vetoed"))

    # ------------------------------------------------------------------ persistence

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        learned = [d for d in (self.classifier, self.anomaly) if d is not None]
        meta = {"format": FORMAT, "version": VERSION, "feature_names": list(self.feature_names),
                "detectors": [d.kind for d in (self.rules, self.classifier, self.anomaly) if d is not None],
                "inputs": {d.kind: list(d.inputs) for d in learned},
                **({"held_inputs": held} if (held := {d.kind: d.held for d in learned if d.held}) else {}),
                "pipeline": self.metadata.get("pipeline", pipeline_signature()),
                "sklearn_version": self.metadata.get("sklearn_version", sklearn.__version__)}
        meta.update({k: v for k, v in self.metadata.items() if k not in meta})
        (path / "model.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
        (path / "metrics.json").write_text(json.dumps(self.metrics, indent=2, default=_json_default) + "\n")
        (path / "rules.json").write_text(json.dumps(self.rules.get_state(), indent=2) + "\n")
        for det in (self.classifier, self.anomaly):
            if det is not None:
                joblib.dump(det.get_state() | {"inputs": list(det.inputs)}, path / f"{det.kind}.joblib", compress=3)
        return path

    @classmethod
    def load(cls, path: str | Path, feature_names: Sequence[str] = FEATURE_NAMES,
             pipeline: PipelineSettings | None = None) -> "ModelBundle":
        """Load a model directory for a pipeline computing *feature_names* with *pipeline*'s windows."""
        path = Path(path)
        mfile = path / "model.json"
        if not mfile.is_file():
            raise ModelError(f"{path}: not a gpuops model directory (no model.json)")
        meta = json.loads(mfile.read_text())
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise ModelError(f"{path}: unsupported model format {meta.get('format')!r} v{meta.get('version')!r}; "
                             "retrain it with `gpuops train RECORDING... --out DIR`")
        want, have = meta.get("pipeline", {}), pipeline_signature(pipeline)
        diff = {k: (want.get(k), have[k]) for k in PIPELINE_KEYS if want.get(k) != have[k]}
        if diff:
            raise ModelError(f"{path}: trained with other pipeline windows than these "
                             + ", ".join(f"{k}={w} (now {h})" for k, (w, h) in diff.items())
                             + ": use the model's settings or train one for these")
        if meta.get("sklearn_version") != sklearn.__version__:
            raise ModelError(f"{path}: saved by scikit-learn {meta.get('sklearn_version')}, but {sklearn.__version__} "
                             "is installed; its trees are read through private attributes, so install that "
                             "version or retrain the model")
        rules = RulesDetector(feature_names)
        rules.set_state(json.loads((path / "rules.json").read_text()))
        bundle = cls(rules, metadata=meta)
        mpath = path / "metrics.json"
        bundle.metrics = json.loads(mpath.read_text()) if mpath.is_file() else {}
        held = _held_inputs(path, meta)
        for kind, ctor in (("classifier", FailureClassifier), ("anomaly", AnomalyDetector)):
            if kind in meta.get("detectors", []):
                f = path / f"{kind}.joblib"
                if not f.is_file():
                    raise ModelNotFitted(f"{path}: {kind} listed in model.json but {f.name} is missing")
                state = joblib.load(f)
                det = ctor(feature_names, state.pop("inputs", None))
                det.set_state(state)
                try:
                    det.hold(held.pop(kind, {}))
                except FeatureMismatch as e:
                    raise ModelError(f"{path}: model.json held_inputs: {e}") from None
                setattr(bundle, kind, det)
        if held:
            raise ModelError(f"{path}: model.json held_inputs names detectors it does not list: {sorted(held)}")
        return bundle


def _held_inputs(path: Path, meta: dict[str, Any]) -> dict[str, dict[str, float]]:
    """model.json's ``held_inputs`` ({detector: {input: constant}}), checked: each is a number, and each input is
    one models/inputs.py excludes from training now (its reason is why the model must not read it)."""
    held = meta.get("held_inputs", {})
    if not isinstance(held, dict) or not all(isinstance(v, dict) for v in held.values()):
        raise ModelError(f"{path}: model.json held_inputs must map a detector to {{input: number}}")
    for kind, values in held.items():
        for name, v in values.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ModelError(f"{path}: model.json held_inputs: {kind} {name} = {v!r} is not a number")
            if exclusion_reason(name) is None:
                raise ModelError(f"{path}: model.json held_inputs: {kind} holds {name}, which models/inputs.py "
                                 "does not exclude; only an input gpuops no longer trains on may be held")
    return {k: dict(v) for k, v in held.items()}


@functools.cache
def _threadpools() -> ThreadpoolController:
    """The process's OpenMP/BLAS pools, found once (a fresh scan of the loaded libraries costs ~3 ms)."""
    return ThreadpoolController()


def default_model_path() -> Path:
    """The model shipped with the package (docs/models.md says how it was trained)."""
    return Path(str(resources.files("models").joinpath("default")))


def load_default() -> ModelBundle:
    return ModelBundle.load(default_model_path())


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)
