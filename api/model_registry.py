"""The model bundles the service may score with, which one is active, and training new ones.

:class:`DirModelRegistry` lists the model directories under one root (each a saved
:class:`~models.bundle.ModelBundle`: ``model.json``, ``metrics.json``, ...). Activating one
loads it first (a bundle that would not load is refused with the loader's reason), records
its name in the ``active`` file (written atomically) and calls ``on_activate(path)``: the
service swaps its scorer there. Training runs the project's trainer
(:func:`models.training.train_bundle`) in a background thread and saves the result under
the root; it is not activated by itself.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from collector.recording import RecordingError, open_recording
from models.base import ModelError

log = logging.getLogger(__name__)


class ModelNotFound(KeyError):
    """No model directory of that name under the root."""

    def __str__(self) -> str:
        return str(self.args[0])


class DirModelRegistry:
    """See the module docstring. ``clock`` stamps jobs (wall s); names are directory names."""

    def __init__(self, root: Path, active: Path, on_activate: Callable[[Path], None] | None = None, *,
                 default: str | None = None, clock: Callable[[], float] = time.time) -> None:
        self.root = Path(root)
        self.active_file = Path(active)
        self.on_activate = on_activate
        self.default = default
        self.clock = clock
        self._jobs: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    # ---- reading ------------------------------------------------------------------------------

    def active(self) -> str | None:
        """The active model's name (the ``active`` file, else ``default``)."""
        try:
            name = self.active_file.read_text().strip()
        except OSError:
            return self.default
        return name or self.default

    def path(self, name: str) -> Path:
        """The directory of model *name*; :class:`ModelNotFound` if there is none."""
        if not name or "/" in name or name in (".", "..") or "\\" in name:
            raise ModelNotFound(f"no model named {name!r}")
        p = self.root / name
        if not (p / "model.json").is_file():
            raise ModelNotFound(f"no model named {name!r} under {self.root} (GET /v1/models lists them)")
        return p

    def list(self) -> list[dict[str, Any]]:
        active = self.active()
        out = []
        if not self.root.is_dir():
            return out
        for p in sorted(self.root.iterdir()):
            if not (p / "model.json").is_file():
                continue
            info: dict[str, Any] = {"name": p.name, "path": str(p), "active": p.name == active}
            try:
                meta = json.loads((p / "model.json").read_text())
                info["detectors"] = [str(d) for d in meta.get("detectors", [])]
                training = meta.get("training", {}) if isinstance(meta.get("training"), dict) else {}
                info["created"] = str(training.get("created") or meta.get("created") or "") or None
                shown = ("format", "version", "sklearn_version", "pipeline", "held_inputs")
                how = ("recordings", "train_rows", "seconds", "seed")
                info["metadata"] = {k: meta[k] for k in shown if k in meta} | {
                    "training": {k: training[k] for k in how if k in training}}
            except (OSError, ValueError) as e:
                info["error"] = f"model.json unreadable: {e}"
            out.append(info)
        return out

    def metrics(self, name: str) -> dict[str, Any]:
        p = self.path(name) / "metrics.json"
        try:
            return {"name": name, "metrics": json.loads(p.read_text()) if p.is_file() else {}}
        except ValueError as e:
            raise ModelError(f"{p}: not JSON ({e})") from None

    # ---- changing -----------------------------------------------------------------------------

    def activate(self, name: str, actor: str) -> dict[str, Any]:
        """Load *name* (refused if it would not load), record it as active, tell the service."""
        from models.bundle import ModelBundle

        path = self.path(name)
        ModelBundle.load(path)                 # ModelError with the reason: refused before anything changes
        tmp = self.active_file.with_name(self.active_file.name + ".tmp")
        self.active_file.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(name + "\n")
        os.replace(tmp, self.active_file)
        log.warning("model %s activated by %s", name, actor)
        if self.on_activate is not None:
            self.on_activate(path)
        return {"name": name, "path": str(path), "active": True, "actor": actor}

    def train(self, params: dict[str, Any], actor: str) -> dict[str, Any]:
        """Start training in the background; returns the job (poll :meth:`job`)."""
        recordings = [Path(r) for r in params["recordings"]]
        for r in recordings:
            try:
                rec = open_recording(r)
            except (RecordingError, OSError, ValueError) as e:
                raise RecordingError(f"{r}: not a readable recording ({e})") from None
            if rec.incidents() is None:
                raise RecordingError(f"{r}: has no incidents.jsonl (ground truth): training needs it")
        name = params.get("name") or time.strftime("trained-%Y%m%d-%H%M%S", time.gmtime(self.clock()))
        if (self.root / name).exists():
            raise ValueError(f"a model named {name!r} exists already: choose another name")
        now = self.clock()
        job = {"id": uuid.uuid4().hex[:16], "kind": "train", "state": "queued", "progress": 0.0, "created_at": now,
               "started_at": None, "finished_at": None, "actor": actor,
               "params": {"recordings": [str(r) for r in recordings], "name": name,
                          "seed": int(params.get("seed", 0)), "val_fraction": float(params.get("val_fraction", 0.3))},
               "error": None, "result": {}}
        with self._lock:
            self._jobs[job["id"]] = job
        threading.Thread(target=self._train, args=(job,), name=f"train-{job['id']}", daemon=True).start()
        return dict(job)

    def _train(self, job: dict[str, Any]) -> None:
        from models.training import TrainSettings, train_bundle

        p = job["params"]
        n = len(p["recordings"])
        job.update(state="running", started_at=self.clock())
        try:
            bundle = train_bundle(p["recordings"], TrainSettings(seed=p["seed"], val_fraction=p["val_fraction"]),
                                  progress=lambda i, f: job.update(progress=min(0.9, 0.9 * (i + f) / n)))
            out = bundle.save(self.root / p["name"])
            job.update(state="succeeded", progress=1.0, result={"name": p["name"], "path": str(out),
                                                                 "metrics": _summary(bundle.metrics)})
        except Exception as e:                  # a background job records its failure; nothing raises
            log.exception("training job %s failed", job["id"])
            job.update(state="failed", error=f"{type(e).__name__}: {e}")
        finally:
            job["finished_at"] = self.clock()

    def job(self, job_id: str) -> dict[str, Any] | None:
        with self._lock:
            j = self._jobs.get(job_id)
            return None if j is None else dict(j)


def _summary(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
