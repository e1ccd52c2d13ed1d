"""Settings of the node agent (``gpuops agent``): env prefix ``GPUOPS_AGENT_``.

Every field documents its unit and why its default is what it is. The CLI flags of
``gpuops agent`` override the environment, which overrides these defaults. Nothing is
built at import time: the composition (``api/commands/agent.py``) makes one instance.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from collector.commands import TOPIC_COMMANDS
from collector.wire import TOPIC_EVENTS, TOPIC_TELEMETRY

#: Sources that read the node's BMC: sampled every ``bmc_interval_s``, not every tick.
BMC_SOURCES = frozenset({"ipmi", "redfish"})


class AgentSettings(BaseSettings):
    """What the agent samples, how often, where it publishes and how much it may buffer."""

    model_config = SettingsConfigDict(env_prefix="GPUOPS_AGENT_", extra="ignore")

    node: str = Field(default_factory=lambda: socket.gethostname().split(".")[0], description=(
        "Node name as the scheduler knows it (Slurm NodeName / Kubernetes node name). Default: the "
        "short host name, which is what both schedulers use unless configured otherwise."))
    sources: str = Field("nvml,infiniband,kmsg", description=(
        "Comma-separated source names. Default: what every GPU node has (driver, HCAs, kernel log); "
        "dcgm needs an exporter URL so it is opt-in."))
    interval_s: float = Field(10.0, gt=0, description=(
        "Seconds between samples. 10 s sees the minutes-long precursors (SBE growth, thermal trends, "
        "link errors) while keeping the agent under 1 % of a core and ~0.1 msg/s per node on Kafka."))
    publish_every_ticks: int = Field(1, ge=1, le=600, description=(
        "Sampling ticks per telemetry message: the agent buffers N ticks of GPU and port rows (each row "
        "keeps its own ts) and publishes them as ONE message; events still go out at once. 1 (default) is "
        "one message per tick. A scoring worker's cost is mostly per message (bench/results/live.md), so "
        "with 1 s sampling N=2-4 multiplies a worker's samples/s while adding at most N x interval_s to "
        "decision latency. The batch span (N x interval_s) must stay below the scoring pipeline's "
        "allowed_lateness_s (scoring_lateness_s here), or a worker closes ticks before a batch's oldest "
        "rows arrive and counts them late."))
    scoring_lateness_s: float = Field(30.0, gt=0, description=(
        "The scoring workers' GPUOPS_PIPELINE_ALLOWED_LATENESS_S (30 s by default there): only used to refuse "
        "a publish_every_ticks x interval_s batch span that would make the workers drop rows as late."))
    sink: Literal["kafka", "stdout"] = Field("kafka", description="Where messages go; stdout is for debugging.")
    bootstrap: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers, host:port[,host:port…].")
    wire_format: Literal["json", "arrow"] = Field("json", description=(
        "Encoding of the telemetry messages (collector.wire): 'json' is readable with any Kafka tool "
        "and is the default; 'arrow' (Arrow IPC columns) lets a scoring worker decode ~2-3x more samples "
        "per second (bench/results/live.md). Scorers read both, so agents can switch one at a time."))
    telemetry_topic: str = Field(TOPIC_TELEMETRY, description="Topic of the per-tick telemetry messages.")
    events_topic: str = Field(TOPIC_EVENTS, description="Topic of the event messages.")
    sysfs_root: Path = Field(Path("/sys"), description="Root of sysfs (a captured tree in tests).")
    kmsg_file: Path | None = Field(None, description="Kernel log to follow instead of /dev/kmsg (a dmesg file).")
    kmsg_from_start: bool = Field(False, description=(
        "Read the kernel log from its start. Off: a restarted agent would re-publish every XID since boot."))
    dcgm_url: str | None = Field(None, description="dcgm-exporter /metrics URL, or a saved scrape file.")
    dcgm_timeout_s: float = Field(2.0, gt=0, description=(
        "Seconds to wait for dcgm-exporter. It answers in milliseconds locally; 2 s bounds a stuck scrape "
        "well inside one interval."))
    bmc_host: str | None = Field(None, description=(
        "The node's BMC for the ipmi source (host name or IP of its management port); {node} stands for this node's "
        "name (e.g. {node}-bmc.mgmt.example). None: ipmi is unconfigured."))
    bmc_port: int = Field(623, ge=1, le=65535, description="IPMI LAN (RMCP+) UDP port of the BMC; 623 is the standard.")
    bmc_user: str | None = Field(None, description=(
        "BMC user for IPMI; an operator-level account suffices to read the SEL and sensors."))
    bmc_password_file: Path | None = Field(None, description=(
        "File holding the BMC password (first line, mode 600); else $IPMI_PASSWORD. Never a flag: argv is public."))
    bmc_state_file: Path | None = Field(Path("/var/lib/gpuops-agent/ipmi-sel.json"), description=(
        "Where the ipmi source keeps the last SEL id it published, so a restart reads no entry twice."))
    bmc_timeout_s: float = Field(10.0, gt=0, description=(
        "Seconds one BMC request may take. BMCs are slow (seconds); 10 s bounds a stuck one within an interval."))
    bmc_interval_s: float = Field(60.0, gt=0, description=(
        "Seconds between two samples of a BMC source (ipmi, redfish); the others sample every interval_s. A BMC is "
        "a small management controller: each ipmitool sample opens an RMCP+ session and reads the SEL and every "
        "sensor, and a Redfish sample makes a request per chassis resource. Exporters scrape BMCs once a minute "
        "(what the simulator and the trained features assume), and polling faster can make a BMC stop answering. "
        "Rounded to whole intervals; at or under interval_s, every tick."))
    redfish_url: str | None = Field(None, description=(
        "Redfish service root of the node's BMC (https://bmc-host); {node} stands for this node's name (e.g. "
        "https://{node}-bmc.mgmt.example: one value for a DaemonSet or a shared env file)."))
    redfish_user: str | None = Field(None, description="Redfish user (HTTP basic auth); none: no auth header.")
    redfish_password_file: Path | None = Field(None, description=(
        "File holding the Redfish password (first line, mode 600); else $REDFISH_PASSWORD."))
    redfish_ca_file: Path | None = Field(None, description=(
        "PEM file of the CA that signed the BMC's HTTPS certificate, or the BMC's own self-signed certificate "
        "(what most BMCs ship with); none: the system's CAs. The certificate must also name the host in redfish_url."))
    redfish_tls_verify: bool = Field(True, description=(
        "Check the BMC's HTTPS certificate. false skips the check (and warns at start): anyone on the management "
        "network could then read the Redfish password. Prefer redfish_ca_file."))
    redfish_skip_chassis: str = Field("", description=(
        "Comma-separated patterns (shell-style, case-sensitive) of chassis Ids the redfish source does not read, "
        "e.g. HGX_GPU_*,HGX_NVSwitch_*: on an HGX board whose BMC does not expand collections every GPU chassis' "
        "sensors cost a request each a minute, and NVML reads the same GPUs. The Id is the last segment of the "
        "chassis' URL, so a skipped chassis costs no request at all. Empty: every chassis."))

    source_wait_s: float = Field(2.0, gt=0, description=(
        "Seconds a tick waits for its sources, each sampling in its own thread (at most half of interval_s). "
        "NVML answers 8 GPUs in ~10 ms and sysfs in ~2 ms, so 2 s only binds on a source that is stuck or a slow "
        "BMC; its result then goes out with a later tick (rows keep their own ts) instead of holding the others."))
    source_stall_s: float = Field(30.0, gt=0, description=(
        "Seconds after which a source's call that has not returned is reported stalled (logged, counted in "
        "source_errors, shown in the health record). A GPU off the bus can hold NVML for minutes; BMC sources "
        "bound each request at bmc_timeout_s (10 s) and make two or three a sample (redfish: two per chassis with "
        "readings, once it has walked them), so 30 s means stuck, not slow. A BMC source is stalled only once its next "
        "sample is due, if that is later (bmc_interval_s): its hourly walk of the chassis can take a while. "
        "Also how long --once waits for its sources."))
    buffer_max_messages: int = Field(2160, ge=1, description=(
        "Messages held while Kafka is unreachable. 2160 = 6 h of ticks at 10 s (a broker upgrade or an "
        "overnight outage) plus their events."))
    buffer_max_bytes: int = Field(64 * 2**20, ge=1024, description=(
        "Bytes held while Kafka is unreachable. 64 MiB: an 8-GPU / 9-port tick is ~10 KiB of JSON, so the "
        "count bound binds first; this caps memory on a node whose RAM belongs to training jobs."))
    buffer_policy: Literal["drop_oldest", "drop_newest"] = Field("drop_oldest", description=(
        "What a full buffer drops. Oldest: the newest telemetry is what predicts an imminent failure."))
    publish_batch_max: int = Field(500, ge=1, description=(
        "Messages per publish attempt when draining a backlog: large enough to drain 6 h in seconds, small "
        "enough that one attempt ends well within an interval."))
    backoff_initial_s: float = Field(0.5, gt=0, description=(
        "First wait after a failed publish. Short: most failures are a leader election that ends in < 1 s."))
    backoff_max_s: float = Field(30.0, gt=0, description=(
        "Longest wait between reconnect attempts: bounds how stale data is after the broker returns, and "
        "keeps a fleet of agents from hammering a recovering broker (with ±20 % jitter)."))
    kafka_request_timeout_s: float = Field(10.0, gt=0, description=(
        "Seconds a produce request may take before it counts as failed. A healthy broker answers in ms; "
        "10 s rides out GC pauses without stalling a 10 s interval for long."))
    kafka_max_block_s: float = Field(5.0, gt=0, description=(
        "Seconds send() may wait for topic metadata; when the broker is down this is how long one "
        "attempt blocks the publisher thread (never the sampler)."))
    shutdown_flush_timeout_s: float = Field(10.0, ge=0, description=(
        "Seconds to keep publishing the backlog after SIGTERM. Kubernetes waits 30 s before SIGKILL."))
    health_file: Path | None = Field(Path("/run/gpuops-agent/health.json"), description=(
        "JSON health (last successful publish, buffer depth, dropped count), rewritten each tick; for "
        "exec probes and node checks. /run is tmpfs: no disk writes. Empty/None disables it."))
    commands_enabled: bool = Field(False, description=(
        "Obey signed GPU-reset commands from the remediation engine (topic command_topic). Off: a node "
        "takes remote actions only once an operator turns this on and installs the shared key."))
    command_key_file: Path | None = Field(None, description=(
        "File holding the shared HMAC key of commands (>= 32 bytes, e.g. `openssl rand -hex 32`), mode 600. "
        "A path, never the key itself: argv and the environment are visible to other users. Required when "
        "commands_enabled."))
    command_topic: str = Field(TOPIC_COMMANDS, description="Topic the engine's commands arrive on, keyed by node.")
    command_max_skew_s: float = Field(30.0, ge=0, le=300, description=(
        "Seconds of clock difference tolerated between engine and node when checking a command's issue and "
        "expiry times. NTP keeps nodes within milliseconds; 30 s rides out a node whose NTP is briefly off "
        "while keeping a stale command's window short."))

    @field_validator("sources")
    @classmethod
    def _sources_not_empty(cls, v: str) -> str:
        if not [s for s in v.split(",") if s.strip()]:
            raise ValueError("at least one source is needed")
        return v

    @model_validator(mode="after")
    def _commands_need_a_key(self) -> "AgentSettings":
        if self.commands_enabled and self.command_key_file is None:
            raise ValueError("commands_enabled needs command_key_file (GPUOPS_AGENT_COMMAND_KEY_FILE): the path "
                             "of the shared key, mode 600")
        return self

    @model_validator(mode="after")
    def _node_in_bmc_addresses(self) -> "AgentSettings":
        """``{node}`` in ``bmc_host`` or ``redfish_url`` is this node's name: one setting for a whole fleet whose
        BMCs are named after their nodes (a DaemonSet, a shared env file). Any other ``{...}`` is refused."""
        for name in ("bmc_host", "redfish_url"):
            value = getattr(self, name)
            if value is None or "{" not in value and "}" not in value:
                continue
            rest = value.replace("{node}", "")
            if "{" in rest or "}" in rest:
                raise ValueError(f"{name}={value!r}: the only placeholder is {{node}} (this node's name, "
                                 f"{self.node!r}), e.g. https://{{node}}-bmc.mgmt.example")
            setattr(self, name, value.replace("{node}", self.node))
        return self

    @model_validator(mode="after")
    def _batch_span_within_lateness(self) -> "AgentSettings":
        if self.publish_every_ticks > 1 and self.batch_span_s >= self.scoring_lateness_s:
            raise ValueError(
                f"publish_every_ticks={self.publish_every_ticks} x interval_s={self.interval_s:g} spans "
                f"{self.batch_span_s:g} s, not less than the scoring workers' allowed lateness "
                f"scoring_lateness_s={self.scoring_lateness_s:g} s: their oldest rows would arrive after their tick "
                "closed and be dropped as late. Lower publish_every_ticks (GPUOPS_AGENT_PUBLISH_EVERY_TICKS), or raise "
                "GPUOPS_PIPELINE_ALLOWED_LATENESS_S on the workers and scoring_lateness_s here to match")
        return self

    @property
    def batch_span_s(self) -> float:
        """Seconds of telemetry one message holds (``publish_every_ticks`` x ``interval_s``)."""
        return self.publish_every_ticks * self.interval_s

    @field_validator("health_file", "kmsg_file", "dcgm_url", "command_key_file", "bmc_host", "bmc_user",
                     "bmc_password_file", "bmc_state_file", "redfish_url", "redfish_user", "redfish_password_file",
                     "redfish_ca_file", mode="before")
    @classmethod
    def _empty_is_none(cls, v: object) -> object:
        return None if isinstance(v, str) and v.strip() in ("", "none", "None") else v

    def sample_every_s(self, source: str) -> float | None:
        """Seconds between two samples of *source* when it is not every tick (the BMC sources), else None."""
        return self.bmc_interval_s if source in BMC_SOURCES and self.bmc_interval_s > self.interval_s else None

    @property
    def redfish_skip_patterns(self) -> tuple[str, ...]:
        """``redfish_skip_chassis`` as patterns, in order, without blanks or duplicates."""
        return tuple(dict.fromkeys(p.strip() for p in self.redfish_skip_chassis.split(",") if p.strip()))

    @property
    def source_names(self) -> list[str]:
        """``sources`` as a list, in order, without blanks or duplicates."""
        return list(dict.fromkeys(s.strip() for s in self.sources.split(",") if s.strip()))
