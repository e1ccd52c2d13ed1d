"""The service's configuration (``gpuops serve --config FILE``): one validated YAML file, env overrides.

:class:`ServiceConfig` is a pydantic-settings class (env prefix ``GPUOPS_``, nested keys with
``__``: ``GPUOPS_SAFETY__ARMED=true``; the environment wins over the file). Every knob says
its unit and why its default. :func:`load_service_config` reads the file and checks what
pydantic alone cannot (the adapter's name and options, the command key file, the model
directory), listing **every** problem in one :class:`ServiceConfigError`, so start-up fails
once with the whole list instead of once per fix.

With no file at all the service runs its embedded default (docs/serve.md): the simulated
fleet, the in-process bus, SQLite under ``state_dir`` and the dry-run adapter.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from collector.commands import TOPIC_COMMANDS
from collector.wire import TOPIC_DEADLETTER, TOPIC_EVENTS, TOPIC_SCORES, TOPIC_TELEMETRY
from remediation.config import POLICY_NAME, PolicyConfig, PolicyConfigError, merged_over, policy_with
from remediation.safety import SafetyConfig

Role = Literal["viewer", "operator", "admin"]


class ServiceConfigError(ValueError):
    """An invalid service configuration (permanent: fix the file); the message lists every problem."""


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/gpuops``, else ``~/.local/state/gpuops``."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "gpuops"


def default_replica() -> str:
    """This process's name among replicas: ``host:pid`` (unique, readable in the lease)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AdapterSection(_Section):
    """Which scheduler adapter carries out armed actions, and its options."""

    name: str = Field("dryrun", description="Adapter by name (remediation.adapters.base.ADAPTERS): dryrun, "
                      "slurm, kubernetes. dryrun: nothing touches a cluster until someone chooses one.")
    options: dict[str, Any] = Field(
        default_factory=dict, description="The adapter's own settings: SlurmAdapter.from_config's keys "
        "(slurm_conf, timeout_s, ...), or for kubernetes kubeconfig, in_cluster and KubernetesAdapterConfig's keys.")


class CommandsSection(_Section):
    """Signed GPU resets through the node agents (docs/engine.md); off unless a key file is given."""

    key_file: Path = Field(description="The shared HMAC key (mode 600), the same file the agents hold.")
    ttl_s: float = Field(300.0, gt=0, le=3600, description="Seconds a reset command stays valid: an agent "
                         "restart fits; an older command was decided on stale telemetry.")


class TokenEntry(_Section):
    """One API bearer token: its SHA-256 (never the token itself) and the role it grants."""

    name: str = Field(description="Who holds it; recorded as the actor of every mutation it makes.")
    role: Role = Field(description="viewer (read), operator (act), admin (arm, models, tokens).")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Hex SHA-256 of the token "
                        "(`printf %s TOKEN | sha256sum`).")


class AuthSection(_Section):
    """Bearer tokens with roles. Empty: ``serve`` makes one admin token and prints it (like Jupyter)."""

    tokens: list[TokenEntry] = Field(default_factory=list, description="The accepted tokens.")


class ScoringSection(_Section):
    """The scoring workers this process runs (Kafka consumer group on gpu.telemetry / gpu.events)."""

    enabled: bool = Field(True, description="Run scoring workers in this process. False: an API/engine-only "
                          "replica, with scoring in other processes of the same group.")
    workers: int = Field(1, ge=1, le=64, description="Worker threads; each is one group member (Kafka splits "
                         "the partitions). 1: a worker is CPU-bound in Python, more help only across processes.")
    group: str = Field("gpuops-scoring", description="Kafka consumer group of the scoring workers.")
    silence_refresh_s: float = Field(30.0, gt=0, description="How often each scoring worker re-reads the "
                                     "silences, s, to freeze the baselines of silenced nodes. 30: a new silence "
                                     "mutes learning within half a minute at one store read per worker.")


class TopicsSection(_Section):
    """Kafka topic names (collector/wire.py's by default; tests and shared brokers use their own)."""

    telemetry: str = Field(TOPIC_TELEMETRY, description="Agents' samples, one message per node per tick.")
    events: str = Field(TOPIC_EVENTS, description="Agents' events (XIDs, command results).")
    scores: str = Field(TOPIC_SCORES, description="The scoring workers' node scores, one message per tick.")
    deadletter: str = Field(TOPIC_DEADLETTER, description="What a consumer could not use, with the reason.")
    commands: str = Field(TOPIC_COMMANDS, description="Signed commands to the agents (GPU resets).")


class SchedulerSection(_Section):
    """Intervals of the background jobs (APScheduler; each job max_instances=1, coalesced)."""

    stale_check_s: float = Field(15.0, gt=0, description="How often silent nodes are looked for, s.")
    verify_s: float = Field(30.0, gt=0, description="How often the leader passes over open actions (retry, "
                            "verify, expire, follow-ups), s, besides after every tick.")
    maintenance_view_s: float = Field(60.0, gt=0, description="How often the scheduler's nodes are re-listed "
                                      "for their partitions, labels and declared maintenance, s. 60: a "
                                      "maintenance window shows within a minute at one list call per minute.")
    retention_s: float = Field(3600.0, gt=0, description="How often old rows are deleted, s.")
    retention_days: float = Field(30.0, gt=0, description="Node scores and alerts older than this go, days; "
                                  "action records (the audit trail) are kept.")
    retrain_enabled: bool = Field(False, description="Scheduled retraining (docs/serve.md): off by default "
                                  "because it needs recordings the operator chooses: ones to train on and a "
                                  "held-out one the new model must beat the current one on before it is used.")
    retrain_s: float = Field(7 * 86400.0, gt=0, description="Retraining interval, s (weekly).")
    retrain_params: dict[str, Any] = Field(default_factory=dict, description="recordings (list, to train on), "
                                           "held_out (a recording with incidents, to judge on), seed, val_fraction.")


class SimulatedFleetSection(_Section):
    """The embedded default's telemetry source: the fleet simulator, sped up."""

    nodes: int = Field(16, ge=1, le=4096, description="Simulated nodes (8 GPUs each).")
    speedup: float = Field(60.0, gt=0, le=10_000, description="Telemetry seconds per wall second. 60: an "
                           "hour of fleet life per minute, so faults show within a minute.")
    seed: int = Field(7, description="Simulator seed (the shipped model never saw seeds below 100).")
    rate_multiplier: float = Field(3000.0, ge=0, description="Failure rate x field data, so a few minutes of "
                                   "simulated time hold incidents (field rate: ~1 per node-year).")
    names: list[str] = Field(default_factory=list, description="Node names (default gpu-node-001...).")


class ServiceConfig(BaseSettings):
    """Everything ``gpuops serve`` composes (module docstring)."""

    model_config = SettingsConfigDict(env_prefix="GPUOPS_", env_nested_delimiter="__", extra="forbid")

    host: str = Field("127.0.0.1", description="API address. Loopback: exposing it is a decision.")
    port: int = Field(8080, ge=0, le=65535, description="API port (0: any free port, printed at start).")
    state_dir: Path = Field(default_factory=default_state_dir, description="Where the default SQLite store lives.")
    store_url: str | None = Field(None, description="Action store URL (sqlite:////path or postgresql+psycopg://"
                                  "...). None: SQLite in state_dir. Replicas (HA) need one PostgreSQL.")
    kafka_bootstrap: str | None = Field(None, description="host:port[,...] of Kafka. None: the embedded "
                                        "in-process bus and the simulated fleet (no external service).")
    replica: str = Field(default_factory=default_replica, description="This replica's name: the lease holder, "
                         "and its own consumer group on gpu.scores (gpuops-view-<replica>).")
    adapter: AdapterSection = Field(default_factory=AdapterSection, description="The scheduler adapter.")
    policy: PolicyConfig = Field(default_factory=PolicyConfig, description="Thresholds (docs/engine.md): over the "
                                 "defaults, a mapping setting merged key by key and `{}` clearing it.")
    safety: SafetyConfig = Field(default_factory=SafetyConfig, description="Limits; armed (docs/engine.md).")
    shadow_policies: dict[Annotated[str, Field(pattern=POLICY_NAME)], dict[str, Any]] = Field(
        default_factory=dict, max_length=8, description="Policies decided beside `policy` on every tick and never "
        "carried out: name -> the settings that differ from `policy` (a mapping setting merged key by key). "
        "GET /v1/engine/shadow and gpuops_shadow_decisions_total show what each would have done "
        "(docs/operations.md).")
    commands: CommandsSection | None = Field(None, description="GPU resets via the agents; None: off.")
    auth: AuthSection = Field(default_factory=AuthSection, description="API bearer tokens with roles.")
    model_dir: Path | None = Field(None, description="Model bundles directory; None: the shipped model.")
    scoring: ScoringSection = Field(default_factory=ScoringSection, description="Scoring in this process.")
    topics: TopicsSection = Field(default_factory=TopicsSection, description="Kafka topic names.")
    pipeline: dict[str, Any] = Field(default_factory=dict, description="PipelineSettings overrides "
                                     "(cadence_s, windows, ...).")
    scheduler: SchedulerSection = Field(default_factory=SchedulerSection, description="Job intervals.")
    lease_ttl_s: float = Field(15.0, ge=1, le=600, description="Engine leader lease, s; renewed every third. A "
                               "standby takes over at most ttl + ttl/3 after the leader dies. Must exceed clock "
                               "skew between replicas plus a store hiccup.")
    stale_after_s: float = Field(300.0, gt=0, description="A node with no score for this long, s (wall time), "
                                 "is shown unknown and alerted once. Above the scorer's retain_silent_s the "
                                 "silence is certain; 5 min rides out an agent restart.")
    drain_on_silence: bool = Field(False, description="Drain a silent node too. False: silence is usually the "
                                   "agent or the network, not the GPU; a person decides.")
    simulate: SimulatedFleetSection = Field(default_factory=SimulatedFleetSection,
                                            description="The simulated fleet (only without kafka_bootstrap).")

    @field_validator("policy", mode="before")
    @classmethod
    def _policy_over_the_defaults(cls, v: Any) -> Any:
        """A ``policy:`` section applies over the defaults as a policy file does (``load_policy_config``)."""
        return merged_over(PolicyConfig(), v) if isinstance(v, Mapping) else v

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        return env_settings, init_settings    # the environment overrides the file

    @property
    def embedded(self) -> bool:
        """No Kafka: the in-process bus fed by the simulated fleet (the embedded default)."""
        return self.kafka_bootstrap is None

    @property
    def resolved_store_url(self) -> str:
        return self.store_url or f"sqlite:///{self.state_dir / 'actions.db'}"


def _problems(e: ValidationError) -> list[str]:
    return [f"{'.'.join(map(str, err['loc'])) or 'config'}: {err['msg']}" for err in e.errors()]


def check(cfg: ServiceConfig) -> list[str]:
    """What pydantic cannot see: adapter name and options, key file, model directory."""
    from remediation.adapters.base import ADAPTERS

    out = []
    if cfg.adapter.name not in ADAPTERS:
        out.append(f"adapter.name: unknown adapter {cfg.adapter.name!r}; valid: {', '.join(sorted(ADAPTERS))}")
    elif cfg.adapter.name == "slurm":
        from remediation.adapters.slurm import SETTINGS
        if unknown := sorted(set(cfg.adapter.options) - SETTINGS):
            out.append(f"adapter.options: unknown Slurm setting(s) {unknown}; valid: {sorted(SETTINGS)}")
    elif cfg.adapter.name == "dryrun" and cfg.adapter.options:
        out.append("adapter.options: the dry-run adapter takes no options")
    if cfg.commands is not None and not cfg.commands.key_file.is_file():
        out.append(f"commands.key_file: {cfg.commands.key_file} does not exist (the agents' shared key, mode 600)")
    if cfg.model_dir is not None and not cfg.model_dir.is_dir():
        out.append(f"model_dir: {cfg.model_dir} is not a directory")
    if cfg.commands is not None and cfg.kafka_bootstrap is None:
        out.append("commands: GPU resets travel on Kafka (gpu.commands); set kafka_bootstrap or drop commands")
    for name, over in cfg.shadow_policies.items():
        if name == "live":
            out.append("shadow_policies.live: 'live' names the policy that acts; call the shadow something else")
            continue
        try:
            policy_with(cfg.policy, over, f"shadow_policies.{name}")
        except PolicyConfigError as e:
            out.append(str(e))
    try:
        from pipeline.settings import PipelineSettings

        PipelineSettings(**cfg.pipeline)
    except ValidationError as e:
        out.extend(f"pipeline.{p}" for p in _problems(e))
    return out


def load_service_config(path: str | Path | None = None, **overrides: Any) -> ServiceConfig:
    """The service config from *path* (None: the embedded default), env and *overrides* (CLI flags).

    Raises :class:`ServiceConfigError` listing every problem found.
    """
    raw: Any = {}
    where = "embedded default"
    if path is not None:
        where = str(path)
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ServiceConfigError(f"{path}: cannot read the service config: {e}") from None
        if not isinstance(raw, dict):
            raise ServiceConfigError(f"{path}: the service config must be a mapping of settings")
    raw = {**raw, **{k: v for k, v in overrides.items() if v is not None}}
    try:
        cfg = ServiceConfig(**raw)
    except ValidationError as e:
        raise ServiceConfigError(f"{where}: " + "; ".join(_problems(e))) from None
    problems = check(cfg)
    if problems:
        raise ServiceConfigError(f"{where}: " + "; ".join(problems))
    return cfg
