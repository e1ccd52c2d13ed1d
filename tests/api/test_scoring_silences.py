"""The service's silences reach the scoring workers' pipelines (issue 13): a silenced node's
parts learn nothing while it lasts. Silences resolve to nodes by scope, are re-read every
``silence_refresh_s`` (not per tick), and the service wires its silence book in."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from api.scoring import ScoringWorker, muted_intervals
from collector.wire import TOPIC_TELEMETRY
from models.bundle import ModelBundle
from pipeline.bus import InProcessBus
from pipeline.muted import MutedInterval
from pipeline.settings import PipelineSettings
from pipeline.stream import FeaturePipeline
from remediation.adapters.base import NodeStatus
from remediation.config import PolicyConfig
from remediation.silences import Silence
from tests.pipeline.synth import Fleet, gpu_frame, telemetry_messages

SETTINGS = PipelineSettings(cadence_s=60, bucket_s=60, short_window_s=60, long_window_s=600, allowed_lateness_s=0)
FLEET = Fleet(nodes=2, gpus=2, ports=0, samples=180, interval_s=10.0, seed=11)
WIN = (FLEET.t0 + 600.0, FLEET.t0 + 1200.0)


def _silence(**kw) -> Silence:
    base = dict(id="sil-1", starts_at=WIN[0], ends_at=WIN[1], author="alice", reason="reseat", created_at=WIN[0])
    return Silence(**{**base, **kw})


def test_silences_become_muted_intervals_by_scope() -> None:
    statuses = {"gpu-a01": NodeStatus("gpu-a01", partitions=("train",)), "gpu-a02": NodeStatus("gpu-a02"),
                "gpu-a03": NodeStatus("gpu-a03", partitions=("train",), extra={"rack": "r1"})}
    got = muted_intervals([
        _silence(nodes=("gpu-b07",)),
        _silence(fleet=True),
        _silence(selector={"partition": "train"}),
        _silence(selector={"rack": "r9"}),                         # covers no node known: nothing muted
        _silence(nodes=("gpu-a02",), deleted_at=WIN[0] + 60.0),    # deleted: over when deleted
        _silence(nodes=("gpu-a02",), deleted_at=WIN[0] - 60.0),    # deleted before it started
    ], statuses)
    assert got == [MutedInterval(("gpu-b07",), *WIN), MutedInterval(None, *WIN),
                   MutedInterval(("gpu-a01", "gpu-a03"), *WIN), MutedInterval(("gpu-a02",), WIN[0], WIN[0] + 60.0)]


def _bursting_frame() -> pd.DataFrame:
    """node 0 GPU 0 logs 50 extra corrected ECC errors per sample inside WIN."""
    g = gpu_frame(FLEET)
    part = ((g["node"] == "gpu-node-000") & (g["gpu"] == 0)).to_numpy()
    ts = g["ts"].to_numpy()
    inside = part & (ts >= WIN[0]) & (ts < WIN[1])
    g.loc[part, "ecc_sbe_vol"] += np.cumsum(inside[part]) * 50.0
    return g


def _score_all(silences, mono) -> ScoringWorker:  # noqa: ANN001
    bus = InProcessBus(partitions=2)
    for node, raw in telemetry_messages(_bursting_frame(), None, FLEET.interval_s):
        bus.produce(TOPIC_TELEMETRY, node, raw)
    worker = ScoringWorker(bus, ModelBundle.rules_only(), SETTINGS, PolicyConfig(), worker_id="w1",
                           silences=silences, silence_refresh_s=30.0, monotonic=mono)
    while any(bus.backlog().values()):
        worker.run_once()
    worker.drain()
    return worker


def _sbe_baseline(pipe: FeaturePipeline) -> float:
    slot = int(pipe.keys.gpus.slots_of(pipe.keys.nodes.ids_of(np.array(["gpu-node-000"])), [0])[0])
    return float(pipe.baselines.gpu.k[0, slot])


def test_a_silence_from_the_service_freezes_the_scoring_workers_baselines() -> None:
    reads = []

    def silences() -> list[MutedInterval]:           # the service's silence book, at our own boundary
        reads.append(1)
        return muted_intervals([_silence(nodes=("gpu-node-000",))], {})

    silenced = _score_all(silences, mono=lambda: 100.0)
    unsilenced = _score_all(None, mono=lambda: 100.0)
    assert len(reads) == 1                            # one read per refresh interval, not per poll or tick
    assert silenced.counters.muted_node_ticks == 10 and unsilenced.counters.muted_node_ticks == 0
    # the same as a pipeline told to mute that window directly, and unlike one that was not
    direct = FeaturePipeline(SETTINGS)
    direct.mute(["gpu-node-000"], *WIN)
    direct.ingest_frames(_bursting_frame())
    direct.flush()
    assert _sbe_baseline(silenced.pipeline) == _sbe_baseline(direct)
    assert _sbe_baseline(unsilenced.pipeline) > _sbe_baseline(silenced.pipeline) + 1000


def test_silences_are_re_read_after_the_refresh_interval_and_a_failed_read_keeps_the_last_set() -> None:
    now = [0.0]
    answers: list = [[MutedInterval(("gpu-node-000",), *WIN)], RuntimeError("store down"), []]

    def silences() -> list[MutedInterval]:
        a = answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a

    worker = ScoringWorker(InProcessBus(), ModelBundle.rules_only(), SETTINGS, PolicyConfig(), worker_id="w1",
                           silences=silences, silence_refresh_s=30.0, monotonic=lambda: now[0])
    worker.run_once()
    assert len(worker.pipeline.muted) == 1
    now[0] = 10.0
    worker.run_once()                                 # within the interval: not read
    assert len(answers) == 2
    now[0] = 31.0
    worker.run_once()                                 # read fails: the last set stays
    assert len(answers) == 1 and len(worker.pipeline.muted) == 1
    now[0] = 62.0
    worker.run_once()                                 # the silence was deleted: nothing muted
    assert len(worker.pipeline.muted) == 0


@pytest.mark.timeout(60)
def test_the_service_hands_its_silences_to_its_scoring_workers(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    from api.config import load_service_config
    from api.service import Service, default_scorer

    cfg = load_service_config(None, port=0, state_dir=str(tmp_path), simulate={"speedup": 120})
    svc = Service(cfg, app_factory=None)
    now = svc.clock()
    sil = svc.engine.silences.create(author="alice", reason="reseat", nodes=["gpu-node-003"], duration_s=3600)
    assert svc.muted_intervals() == [MutedInterval(("gpu-node-003",), sil.starts_at, sil.ends_at)]
    monkeypatch.setattr(Service, "bundle", lambda self: ModelBundle.rules_only())
    worker = default_scorer(svc, InProcessBus(), "gpuops-scoring-test-0")
    worker.refresh_silences()
    assert worker.silence_refresh_s == cfg.scoring.silence_refresh_s
    nodes = worker.pipeline.keys.nodes
    nodes.id_of("gpu-node-001"), nodes.id_of("gpu-node-003")
    assert worker.pipeline.muted.nodes_muted(nodes, now, now + 60).tolist() == [False, True]
