"""Replays as background jobs (``/v1/replays``): start one on a recording, poll it, fetch its report.

:class:`ThreadReplayJobs` runs :class:`~api.replay.Replayer` in a small thread pool (one at a
time by default: a replay takes a core) and keeps each job's state, progress (0-1 of the
recording's telemetry time) and, when done, the report of spec/recording.md — the same one
``gpuops replay`` writes. The recording is checked when the job is asked for (exists, is a
recording directory, and, when ``roots`` is given, lies under one of them), so a bad path is
a 422 at once rather than a failed job later.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

from collector.recording import RecordingError, open_recording
from models.bundle import ModelBundle
from remediation.config import PolicyConfig, policy_with

log = logging.getLogger(__name__)


class ThreadReplayJobs:
    """See the module docstring. ``bundle_loader`` returns the model to replay with (the active one)."""

    def __init__(self, bundle_loader: Callable[[], ModelBundle], policy: PolicyConfig, max_workers: int = 1, *,
                 roots: Sequence[Path] | None = None, keep: int = 50, clock: Callable[[], float] = time.time) -> None:
        self.bundle_loader = bundle_loader
        self.policy = policy
        self.roots = [Path(r).resolve() for r in roots] if roots is not None else None
        self.keep = keep
        self.clock = clock
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="replay")
        self._jobs: dict[str, dict[str, Any]] = {}
        self._reports: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def _check(self, recording: str) -> Path:
        p = Path(recording)
        try:
            resolved = p.resolve()
        except (OSError, RuntimeError, ValueError) as e:
            raise RecordingError(f"{recording}: cannot resolve the path ({e})") from None
        if self.roots is not None and not any(resolved.is_relative_to(r) for r in self.roots):
            raise RecordingError(f"{recording}: outside the recording roots this service replays from "
                                 f"({', '.join(map(str, self.roots))})")
        if not resolved.is_dir():   # (~ is not expanded: the path is the server's, as given)
            raise RecordingError(f"{recording}: no such recording directory on the server")
        try:
            open_recording(resolved)
        except (RecordingError, OSError, ValueError) as e:
            raise RecordingError(f"{recording}: not a recording directory ({e})") from None
        return resolved

    def start(self, recording: str, params: dict[str, Any], actor: str) -> dict[str, Any]:
        """Queue a replay of *recording*; ``params["compare_policies"]`` (name -> settings over this service's
        policy) are decided beside it. A bad path or an invalid alternative raises before anything is queued."""
        path = self._check(recording)
        alternatives = {name: policy_with(self.policy, over, f"compare_policies.{name}")
                        for name, over in params.get("compare_policies", {}).items()}
        job = {"id": uuid.uuid4().hex[:16], "kind": "replay", "state": "queued", "progress": 0.0,
               "created_at": self.clock(), "started_at": None, "finished_at": None, "actor": actor,
               "params": {"recording": str(path), **params}, "error": None, "result": {}}
        with self._lock:
            self._jobs[job["id"]] = job
            self._forget_old()
        self._pool.submit(self._run, job, path, alternatives)
        return dict(job)

    def _run(self, job: dict[str, Any], path: Path, alternatives: dict[str, PolicyConfig]) -> None:
        from api.replay import Replayer, build_report, headline

        job.update(state="running", started_at=self.clock())
        try:
            bundle = self.bundle_loader()
            result = Replayer(bundle, self.policy, alternatives=alternatives).run(
                path, progress=lambda f: job.update(progress=min(1.0, float(f))))
            report = build_report(path, result, {"path": bundle.metadata.get("path")}, self.policy)
            with self._lock:
                self._reports[job["id"]] = report
            job.update(state="succeeded", progress=1.0, result=headline(report))
        except Exception as e:                 # a job records its failure; the pool carries on
            log.exception("replay job %s failed", job["id"])
            job.update(state="failed", error=f"{type(e).__name__}: {e}")
        finally:
            job["finished_at"] = self.clock()

    def _forget_old(self) -> None:
        done = [j for j in self._jobs.values() if j["state"] in ("succeeded", "failed")]
        for j in sorted(done, key=lambda j: j["created_at"])[:max(0, len(self._jobs) - self.keep)]:
            self._jobs.pop(j["id"], None)
            self._reports.pop(j["id"], None)

    def get(self, job_id: str) -> dict[str, Any] | None:
        with self._lock:
            j = self._jobs.get(job_id)
            return None if j is None else dict(j)

    def report(self, job_id: str) -> dict[str, Any] | None:
        with self._lock:
            return self._reports.get(job_id)

    def list(self) -> list[dict[str, Any]]:
        with self._lock:
            return sorted((dict(j) for j in self._jobs.values()), key=lambda j: -j["created_at"])

    def close(self) -> None:
        """Stop taking jobs; running ones finish in the background."""
        self._pool.shutdown(wait=False, cancel_futures=True)
