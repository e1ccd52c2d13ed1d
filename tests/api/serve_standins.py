"""Small stand-ins for the parts of ``gpuops serve`` other work owns, until they land.

A scoring worker (StreamWorker → score → ``gpu.scores``) and a minimal API (``GET /v1/nodes``
behind a bearer token) with the same wiring the service gives the real ones. Test files
only; ``python -m tests.api.serve_standins --config FILE`` runs a service with them (and,
when ``GPUOPS_TEST_CLUSTER_FILE`` names a file, with the file-backed test cluster as adapter).
"""

from __future__ import annotations

import hashlib
import secrets
import sys
from typing import Any

import numpy as np

from collector.wire import TOPIC_SCORES
from models.explainer import Explainer
from models.node_scores import aggregate, score_batches
from models.score_wire import encode_scores
from pipeline.stream import FeaturePipeline
from pipeline.worker import StreamTopics, StreamWorker


class StandInScorer:
    """Scores each closed tick and publishes one gpu.scores message for it."""

    def __init__(self, bus: Any, bundle: Any, settings: Any, name: str = "", topics: Any = None) -> None:
        self.bus, self.bundle, self.name = bus, bundle, name
        self.scores_topic = topics.scores if topics is not None else TOPIC_SCORES
        self.explainer = Explainer(bundle)
        st = StreamTopics(topics.telemetry, topics.events, topics.deadletter) if topics is not None else StreamTopics()
        self.worker = StreamWorker(bus, FeaturePipeline(settings), self._score, st)

    def _score(self, batch: Any) -> None:
        ns = aggregate(batch, score_batches(self.bundle, [batch])[0], self.bundle.rules)
        worth = np.flatnonzero((ns.rule >= 0) | (ns.p_fail >= 0.3))
        reasons = self.explainer.reasons(batch, ns, worth)
        self.bus.produce(self.scores_topic, self.name or None, encode_scores(ns, reasons, worker=self.name))

    def run_once(self) -> Any:
        return self.worker.run_once()


def standin_scorer(service: Any, bus: Any, name: str) -> StandInScorer:
    return StandInScorer(bus, service.bundle(), service.pipeline_settings, name, service.topics)


def standin_app(service: Any) -> Any:
    from fastapi import FastAPI, Header, HTTPException, Response

    token = service.admin_token = secrets.token_urlsafe(24)
    digests = {hashlib.sha256(token.encode()).hexdigest()} | {t.sha256 for t in service.cfg.auth.tokens}
    app = FastAPI()

    @app.get("/v1/nodes")
    def nodes(authorization: str = Header("")) -> Response:
        got = hashlib.sha256(authorization.removeprefix("Bearer ").encode()).hexdigest()
        if got not in digests:
            raise HTTPException(401, "a bearer token is required")
        return Response(service.nodes.list_body(), media_type="application/json")

    @app.get("/v1/engine")
    def engine() -> dict[str, Any]:
        return {"leader": service.elector.is_leader(), "epoch": service.elector.epoch,
                "replica": service.cfg.replica, **service.engine.status()}

    return app


def missing_parts() -> dict[str, Any]:
    """Service keyword arguments putting a stand-in where the real part has not landed."""
    import importlib.util

    out: dict[str, Any] = {}
    if importlib.util.find_spec("api.scoring") is None:
        out["scorer_factory"] = standin_scorer
    if importlib.util.find_spec("api.app") is None:
        out["app_factory"] = standin_app
    return out


def main(argv: list[str]) -> None:
    """``serve --config FILE`` with the stand-ins where the real parts are missing, and with
    ``GPUOPS_TEST_CLUSTER_FILE`` set, the file-backed cluster (tests/api/file_cluster.py) as adapter."""
    import argparse
    import logging
    import os
    from pathlib import Path

    from api.commands.serve import run_service
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", type=Path)
    args = ap.parse_args(argv)
    kw = missing_parts()
    if os.environ.get("GPUOPS_TEST_CLUSTER_FILE"):
        from tests.api.file_cluster import FileClusterAdapter

        kw["adapter"] = FileClusterAdapter(os.environ["GPUOPS_TEST_CLUSTER_FILE"])
    run_service(args.config, **kw)


if __name__ == "__main__":
    main(sys.argv[1:])
