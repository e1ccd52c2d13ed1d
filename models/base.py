"""The detector interface every model shares, and its errors.

Public ``fit`` / ``score`` live here and check their inputs; subclasses implement only
``_fit`` / ``_score`` (the Merlion pattern). Every detector scores a whole feature
matrix at once — one scikit-learn call costs milliseconds however small, so models
never score row by row — in chunks of :data:`SCORE_CHUNK_ROWS`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from collector.schema import FaultClass

#: Rows per scikit-learn call: big enough to amortise the per-call cost, small enough
#: to stay in cache (PERFORMANCE.md: 100 k rows at once predicts 2.5x slower).
SCORE_CHUNK_ROWS = 10_000

#: Label/class index space used by every model: 0 = healthy, then the node faults.
CLASSES: tuple[str, ...] = ("none",) + tuple(f.value for f in FaultClass if f.is_node_fault)
NO_FAULT = 0


def class_index(fault: FaultClass | str) -> int:
    """Index of a fault class in :data:`CLASSES` (app_error maps to ``none``: not a node fault)."""
    value = FaultClass(fault).value
    return CLASSES.index(value) if value in CLASSES else NO_FAULT


class ModelError(Exception):
    """Base of model errors."""


class ModelNotFitted(ModelError):
    """Scoring before fitting, or a saved model missing its parameters (permanent)."""


class FeatureMismatch(ModelError):
    """The features given are not the ones the model was trained on (permanent)."""


@dataclass
class DetectorOutput:
    """What a detector says about each row of a feature matrix.

    ``p``: probability-like score in [0, 1] that the row's GPU has (or is about to have)
    a node fault; ``fault``: index into :data:`CLASSES` of the most likely fault
    (0 when the detector does not know); ``detail``: detector-specific extra arrays.
    """

    p: np.ndarray
    fault: np.ndarray
    detail: dict[str, np.ndarray]


class Detector(ABC):
    """Base class: validates input, chunks scoring, remembers the feature names.

    Every detector is handed the pipeline's whole feature matrix (``feature_names``) and
    reads the columns named in ``inputs`` (all of them by default), looked up by name: a
    model keeps working when the pipeline appends features, and refuses to load when a
    feature it reads is gone.
    """

    #: registry name, also the file stem of its saved parameters
    kind: str = "detector"

    def __init__(self, feature_names: Sequence[str], inputs: Sequence[str] | None = None):
        self.feature_names = tuple(feature_names)
        self.inputs = self.feature_names if inputs is None else tuple(inputs)
        index = {n: i for i, n in enumerate(self.feature_names)}
        missing = [n for n in self.inputs if n not in index]
        if missing:
            raise FeatureMismatch(f"{self.kind}: reads features this gpuops does not compute: {missing[:5]}"
                                  f"{' …' if len(missing) > 5 else ''}; retrain it with `gpuops train RECORDING... --out DIR`")
        cols = np.array([index[n] for n in self.inputs], np.intp)
        #: input columns, or None when the detector reads the whole matrix as it is
        self._input_cols = None if np.array_equal(cols, np.arange(len(self.feature_names))) else cols
        #: inputs read as a constant whatever the row says (see :meth:`hold`), and where they sit in its inputs
        self.held: dict[str, float] = {}
        self._held_cols = np.zeros(0, np.intp)
        self._held_values = np.zeros(0, np.float32)
        self.fitted = False

    def hold(self, values: Mapping[str, float]) -> None:
        """Read the inputs named in *values* as those constants from now on, whatever the rows say.

        For a trained model whose inputs include a feature gpuops has since stopped trusting
        (models/inputs.py says why): the trees are kept and see that feature as the constant
        (for an event count, 0: "none in the window"), so no verdict depends on it."""
        unknown = [n for n in values if n not in self.inputs]
        if unknown:
            raise FeatureMismatch(f"{self.kind}: cannot hold {unknown[:5]}: not among the inputs it was trained on")
        self.held = {n: float(v) for n, v in values.items()}
        pos = {n: i for i, n in enumerate(self.inputs)}
        self._held_cols = np.array([pos[n] for n in self.held], np.intp)
        self._held_values = np.array(list(self.held.values()), np.float32)

    def select(self, x: np.ndarray) -> np.ndarray:
        """The detector's input columns of feature rows *x* (pipeline order), C-contiguous: ``x[..., cols]``
        comes out Fortran-ordered, and the compiled trees then copied it once per ensemble member. Held inputs
        read their constants."""
        out = x if self._input_cols is None else np.take(x, self._input_cols, axis=-1)
        if self._held_cols.size:
            if out is x:
                out = x.copy()
            out[..., self._held_cols] = self._held_values
        return out

    def fit(self, x: np.ndarray, y: np.ndarray | None = None, *, sample_weight: np.ndarray | None = None,
            **kw: Any) -> "Detector":
        x = self._check(x)
        if y is not None and len(y) != len(x):
            raise ValueError(f"{len(x)} rows but {len(y)} labels")
        kw = {k: (self.select(self._check(v)) if k == "x_val" and v is not None else v) for k, v in kw.items()}
        self._fit(self.select(x), y, sample_weight=sample_weight, **kw)
        self.fitted = True
        return self

    def score(self, x: np.ndarray) -> DetectorOutput:
        if not self.fitted:
            raise ModelNotFitted(f"{self.kind} detector is not fitted")
        x = self.select(self._check(x))
        if len(x) <= SCORE_CHUNK_ROWS:
            return self._score(x)
        parts = [self._score(x[i:i + SCORE_CHUNK_ROWS]) for i in range(0, len(x), SCORE_CHUNK_ROWS)]
        return DetectorOutput(np.concatenate([p.p for p in parts]), np.concatenate([p.fault for p in parts]),
                              {k: np.concatenate([p.detail[k] for p in parts]) for k in parts[0].detail})

    def _check(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != len(self.feature_names):
            raise FeatureMismatch(f"{self.kind}: expected {len(self.feature_names)} feature columns, "
                                  f"got shape {x.shape}")
        return x

    @abstractmethod
    def _fit(self, x: np.ndarray, y: np.ndarray | None, *, sample_weight: np.ndarray | None, **kw: Any) -> None:
        ...

    @abstractmethod
    def _score(self, x: np.ndarray) -> DetectorOutput:
        ...

    # persistence: parameters as a dict (JSON-able config + arrays/estimators pickled by the bundle)
    @abstractmethod
    def get_state(self) -> dict[str, Any]:
        ...

    @abstractmethod
    def set_state(self, state: dict[str, Any]) -> None:
        ...
