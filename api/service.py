"""``gpuops serve``'s composition: every long-running part, built from a :class:`~api.config.ServiceConfig`.

What runs in one process (docs/serve.md has the picture):

- **scoring workers** (``scoring.enabled``): threads running :mod:`api.scoring`'s worker — a
  consumer group on ``gpu.telemetry``/``gpu.events`` → pipeline → models → ``gpu.scores``;
- **the scores feed** (:mod:`api.scores_feed`): this replica's own consumer of
  ``gpu.scores``/``gpu.events`` feeding the fleet view, and on the leader the engine;
- **the leader elector** (:mod:`api.leader`): the engine acts only while this replica holds
  the store's lease; on gaining it the engine reconciles and rebuilds, on losing it stops at once;
- **the jobs** (:mod:`api.jobs`, APScheduler): stale telemetry, verification, retention, retraining;
- **the API** (``api.app.create_app``) under uvicorn;
- in the **embedded default** (no Kafka): the simulated fleet
  (:class:`collector.simulator.live.LiveFleet`) feeding an in-process bus, and the engine on
  the fleet's (sped-up) telemetry clock.

:meth:`Service.start` starts it all and returns; :meth:`Service.stop` is the graceful shutdown:
stop consuming (each loop finishes the batch and tick in hand, and its offsets are committed),
stop the jobs, release the lease (a standby takes over at once), then stop the API.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from pipeline.bus import Bus, InProcessBus
from pipeline.settings import PipelineSettings
from remediation.adapters.base import Adapter, adapter_class
from remediation.config import policy_with
from remediation.engine import Engine
from remediation.shadow import ShadowPolicies
from remediation.store import ActionStore

from api.config import ServiceConfig
from api.jobs import ServiceJobs, build_scheduler
from api.leader import LeaderElector
from api.nodeview import NodeView
from api.scores_feed import ScoresFeed

log = logging.getLogger(__name__)


class ScoringWorkerLike(Protocol):
    """What the service drives in a scoring thread (api/scoring.py's worker)."""

    def run_once(self) -> Any: ...


#: (service, bus, worker name) -> a scoring worker on that bus
ScorerFactory = Callable[["Service", Bus, str], ScoringWorkerLike]
#: service -> the ASGI app (api.app.create_app over the service's AppContext)
AppFactory = Callable[["Service"], Any]


def build_adapter(cfg: ServiceConfig) -> Adapter:
    """The adapter named in the config, with its options (the name was checked at load)."""
    cls = adapter_class(cfg.adapter.name)
    opts = dict(cfg.adapter.options)
    if cfg.adapter.name == "kubernetes":
        from remediation.adapters.kubernetes import KubernetesAdapterConfig

        conn = {k: opts.pop(k) for k in ("kubeconfig", "in_cluster") if k in opts}
        return cls(config=KubernetesAdapterConfig(**opts), **conn)
    if hasattr(cls, "from_config"):
        return cls.from_config(opts)
    return cls(**opts)


def _shadow(cfg: ServiceConfig) -> ShadowPolicies | None:
    """The service config's shadow policies over its policy (checked by api.config.check); None without any."""
    if not cfg.shadow_policies:
        return None
    return ShadowPolicies({n: policy_with(cfg.policy, over, f"shadow_policies.{n}")
                           for n, over in cfg.shadow_policies.items()})


def default_scorer(service: "Service", bus: Bus, name: str) -> ScoringWorkerLike:
    """api/scoring.py's worker on *bus*, scoring with the service's model bundle."""
    from api.scoring import ScoringWorker
    from pipeline.worker import StreamTopics

    t = service.topics
    return ScoringWorker(bus, service.bundle(), service.pipeline_settings, service.cfg.policy, worker_id=name,
                         scores_topic=t.scores, topics=StreamTopics(t.telemetry, t.events, t.deadletter),
                         clock=service.clock, silences=service.muted_intervals,
                         silence_refresh_s=service.cfg.scoring.silence_refresh_s)


def default_app(service: "Service") -> Any:
    """The FastAPI app over the service's context (api/app.py), with its auth, metrics and registries."""
    from api.app import create_app
    from api.auth import Auth
    from api.context import AppContext
    from api.metrics import Metrics
    from api.model_registry import DirModelRegistry
    from api.replay_jobs import ThreadReplayJobs

    cfg = service.cfg
    auth = Auth.from_config([t.model_dump() for t in cfg.auth.tokens])
    if not cfg.auth.tokens:
        service.admin_token = auth.generate_admin()
    root = cfg.model_dir or service.state_dir / "models"
    service.models = DirModelRegistry(root, service.state_dir / "active_model", service.activate_model)
    service.metrics = Metrics()
    ctx = AppContext(store=service.store, engine=service.engine, nodes=service.nodes, models=service.models,
                     replays=ThreadReplayJobs(service.bundle, cfg.policy), auth=auth, metrics=service.metrics,
                     is_leader=service.elector.is_leader, ready=service.ready)
    service.jobs.models = service.models
    service.context = ctx
    return create_app(ctx)


@dataclass
class _Loop:
    name: str
    thread: threading.Thread
    closers: list[Callable[[], None]] = field(default_factory=list)


class Service:
    """The always-on service (module docstring). Build, :meth:`start`, later :meth:`stop`."""

    def __init__(self, cfg: ServiceConfig, *, scorer_factory: ScorerFactory = default_scorer,
                 app_factory: AppFactory | None = default_app, adapter: Adapter | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.cfg = cfg
        self.state_dir = Path(cfg.state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.pipeline_settings = PipelineSettings(**{**cfg.pipeline, "bus": "kafka" if cfg.kafka_bootstrap else
                                                     "inprocess", "kafka_bootstrap": cfg.kafka_bootstrap or
                                                     "127.0.0.1:9092", "kafka_group": cfg.scoring.group})
        self._scorer_factory, self._app_factory = scorer_factory, app_factory
        self.topics = cfg.topics
        self.stop_event = threading.Event()
        self.fleet = None
        self._bus: InProcessBus | None = None
        if cfg.embedded:
            self._bus = InProcessBus(partitions=4, topics=(self.topics.telemetry, self.topics.events))
            self.fleet = self._build_fleet(self._bus)
        self.clock = clock or (self.fleet.now if self.fleet is not None else time.time)
        self.store = ActionStore(cfg.resolved_store_url)
        self.store.migrate()
        self.adapter = adapter or build_adapter(cfg)
        self._feed_bus = self._make_feed_bus()
        self.engine = Engine(self.store, self.adapter, policy=cfg.policy, safety=cfg.safety,
                             commands=self._commands(), clock=self.clock, shadow=_shadow(cfg))
        self.engine.acting = False                   # until this replica holds the lease
        self.nodes = NodeView()
        self.elector = LeaderElector(self.store, cfg.replica, cfg.lease_ttl_s,
                                     on_gain=self._on_gain, on_loss=self._on_loss)
        self.feed = ScoresFeed(self._feed_bus, self.nodes, self.engine, self.elector.is_leader,
                               scores_topic=self.topics.scores, events_topic=self.topics.events)
        self.models: Any = None
        self.metrics: Any = None
        self.jobs = ServiceJobs(self.store, self.engine, self.nodes, self.feed.last_seen, self.elector.is_leader,
                                stale_after_s=cfg.stale_after_s, drain_on_silence=cfg.drain_on_silence,
                                retention_days=cfg.scheduler.retention_days,
                                retrain_params=cfg.scheduler.retrain_params)
        self.scheduler = build_scheduler(self.jobs, cfg.scheduler)
        self.scorers: list[ScoringWorkerLike] = []
        self.admin_token: str | None = None
        self.context: Any = None
        self.app: Any = None
        self.server: Any = None
        self.port: int | None = None
        self._loops: list[_Loop] = []
        self._bundle: Any = None
        self._stopped = threading.Event()

    # ---- parts ----------------------------------------------------------------------------

    def _build_fleet(self, bus: InProcessBus) -> Any:
        from collector.simulator import SimConfig
        from collector.simulator.live import LiveFleet

        s = self.cfg.simulate
        start = float(int(time.time() // 60 * 60))
        names = tuple(s.names)
        sim = SimConfig(nodes=len(names) or s.nodes, names=names, hours=24, seed=s.seed,
                        rate_multiplier=s.rate_multiplier, start_ts=start)
        return LiveFleet(sim, bus.produce, speedup=s.speedup, telemetry_topic=self.topics.telemetry,
                         events_topic=self.topics.events, backlog=self._unread)

    def _unread(self) -> int:
        """Messages the embedded fleet's readers have not polled yet: the scorer's (when this process
        scores) and the scores feed's. The fleet waits on it, so its clock never outruns them."""
        buses = [self._feed_bus] + ([self._bus] if self.cfg.scoring.enabled and self._bus is not None else [])
        return sum(n or 0 for b in buses for n in b.backlog().values())

    def _make_feed_bus(self) -> Bus:
        if self._bus is not None:
            return self._bus.consumer((self.topics.scores, self.topics.events))
        from pipeline.kafka_bus import KafkaBus

        # a group of its own per replica: every replica sees every tick; "latest" for a new group,
        # so a replica's first start does not decide on old ticks (later starts resume where it was)
        group = "gpuops-view-" + re.sub(r"[^A-Za-z0-9._-]", "-", self.cfg.replica)
        return KafkaBus(self.cfg.kafka_bootstrap, group, (self.topics.scores, self.topics.events),
                        client_id=group, auto_offset_reset="latest")

    def _commands(self) -> Any:
        c = self.cfg.commands
        if c is None:
            return None
        from collector.commands import load_key
        from remediation.adapters.agent_commands import CommandSender

        return CommandSender(self._feed_bus, load_key(c.key_file), topic=self.topics.commands, ttl_s=c.ttl_s)

    def _scoring_bus(self, name: str) -> Bus:
        if self._bus is not None:
            return self._bus
        from pipeline.kafka_bus import KafkaBus

        return KafkaBus(self.cfg.kafka_bootstrap, self.cfg.scoring.group,
                        (self.topics.telemetry, self.topics.events), client_id=re.sub(r"[^A-Za-z0-9._-]", "-", name))

    def bundle(self) -> Any:
        """The model bundle the scoring workers use: the registry's active one, else the shipped one."""
        if self._bundle is None:
            from models.bundle import ModelBundle, default_model_path

            path = default_model_path()
            active = self.models.active() if self.models is not None and hasattr(self.models, "active") else None
            if active:
                path = self.models.path(active)
            self._bundle = ModelBundle.load(path, pipeline=self.pipeline_settings)
        return self._bundle

    def muted_intervals(self) -> list[Any]:
        """The silences in the store (recent ones, ended included: a backlog may still cover
        them) as the scoring pipelines' muted intervals; selectors resolved on the engine's
        last view of the nodes."""
        from api.scoring import muted_intervals

        return muted_intervals(self.engine.silences.list(include_all=True, limit=1000), self.engine.node_statuses())

    def activate_model(self, path: Path) -> None:
        """A model was activated (the registry loaded it first): the scoring workers score with it from now."""
        from models.bundle import ModelBundle

        bundle = ModelBundle.load(path, pipeline=self.pipeline_settings)  # refuses a model of other windows
        self._bundle = bundle
        for w in self.scorers:
            w.use_bundle(bundle)
        log.warning("model %s active: the scoring workers score with it from their next tick", path)

    # ---- leadership -----------------------------------------------------------------------

    def _on_gain(self, epoch: int) -> None:
        self.engine.acting = True
        self.engine.start()                          # reconcile in-flight actions, rebuild holds
        self.nodes.set_held(self.engine.holds)
        log.warning("engine started as leader (epoch %d): armed=%s adapter=%s", epoch, self.engine.armed,
                    self.adapter.name)

    def _on_loss(self) -> None:
        self.engine.acting = False

    def ready(self) -> tuple[bool, str]:
        """For /readyz: the store answers, and scores have arrived (when this process scores)."""
        try:
            self.store.get_setting("armed")
        except Exception as e:  # noqa: BLE001 - any store failure means "not ready"
            return False, f"action store: {e}"
        if self.feed.ticks == 0:
            return False, "no gpu.scores received yet"
        return True, "leader" if self.elector.is_leader() else "standby"

    # ---- life cycle ------------------------------------------------------------------------

    def _spawn(self, name: str, target: Callable[[threading.Event], None], closers: list[Callable[[], None]] = ()
               ) -> None:
        t = threading.Thread(target=target, args=(self.stop_event,), name=name, daemon=True)
        self._loops.append(_Loop(name, t, list(closers)))
        t.start()

    def _scoring_loop(self, worker: ScoringWorkerLike) -> Callable[[threading.Event], None]:
        def run(stop: threading.Event) -> None:
            dead = 0
            while not stop.is_set():
                try:
                    worker.run_once()
                except Exception:  # noqa: BLE001 - log and continue (STYLE.md 9)
                    log.exception("scoring worker failed a batch; continuing")
                    stop.wait(1.0)
                    continue
                dead = self._push_metrics(worker, dead)
        return run

    def _push_metrics(self, worker: Any, dead_before: int) -> int:
        """Pipeline lag and dead letters of *worker* into /metrics (when the API's metrics exist)."""
        m = self.metrics
        counters = getattr(worker, "counters", None)
        stream = getattr(worker, "stream", None) or getattr(worker, "worker", None)
        dead = int(getattr(stream, "deadlettered", 0) or 0)
        if m is not None:
            lag = getattr(counters, "lag_s", None)
            if lag is not None:
                m.observe_lag(lag)
            m.deadlettered(dead - dead_before, "pipeline")
        return dead

    def start(self) -> "Service":
        """Start every part; returns once the API listens (``self.port``)."""
        if self._app_factory is not None:
            self.app = self._app_factory(self)       # first: it builds the model registry the scorers read
        self.elector.step()                          # lead at once when nobody else does
        self._spawn("gpuops-leader", self.elector.run)
        self._spawn("gpuops-scores-feed", self.feed.run, [self._feed_bus.close])
        if self.cfg.scoring.enabled:
            n = 1 if self._bus is not None else self.cfg.scoring.workers  # one in-process log, one reader
            for k in range(n):
                name = f"gpuops-scoring-{self.cfg.replica}-{k}"
                bus = self._scoring_bus(name)
                worker = self._scorer_factory(self, bus, name)
                self.scorers.append(worker)
                close = getattr(worker, "close", None) or (None if bus is self._bus else bus.close)
                self._spawn(name, self._scoring_loop(worker), [close] if close else [])
        if self.fleet is not None:
            self._spawn("gpuops-simulated-fleet", self.fleet.run)
        self.scheduler.start()
        if self.app is not None:
            self._start_api()
        return self

    def _start_api(self) -> None:
        import uvicorn

        config = uvicorn.Config(self.app, host=self.cfg.host, port=self.cfg.port, log_level="warning",
                                lifespan="on", access_log=False)
        self.server = uvicorn.Server(config)
        t = threading.Thread(target=self.server.run, name="gpuops-api", daemon=True)
        t.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not t.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the API did not start on {self.cfg.host}:{self.cfg.port} "
                                   "(port in use? see the log above)")
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self._api_thread = t

    @property
    def url(self) -> str:
        return f"http://{self.cfg.host}:{self.port}"

    def stop(self, timeout_s: float = 30.0) -> None:
        """Graceful shutdown (module docstring); idempotent."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        log.warning("shutting down: stop consuming, finish the tick in hand, commit, release the lease")
        self.stop_event.set()
        deadline = time.monotonic() + timeout_s
        for loop in self._loops:
            loop.thread.join(max(0.1, deadline - time.monotonic()))
            if loop.thread.is_alive():
                log.error("%s did not stop within %.0f s", loop.name, timeout_s)
        for loop in self._loops:
            for close in loop.closers:
                try:
                    close()
                except Exception as e:  # noqa: BLE001 - shutting down: report and go on
                    log.warning("closing %s: %s", loop.name, e)
        try:
            self.scheduler.shutdown(wait=True)
        except Exception as e:  # noqa: BLE001
            log.warning("stopping the scheduler: %s", e)
        self.elector.release()
        if self.server is not None:
            self.server.should_exit = True
            self._api_thread.join(max(0.1, deadline - time.monotonic()))
        self.store.close()

    def run_until_signalled(self) -> None:
        """Start, then wait for SIGTERM or SIGINT and shut down gracefully (the CLI's main loop)."""
        import signal

        def handler(signum: int, _frame: Any) -> None:
            log.warning("signal %d received", signum)
            self.stop_event.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
        try:
            self.stop_event.wait()
        finally:
            self.stop()
