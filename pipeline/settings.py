"""Settings of the feature pipeline: windows, scoring cadence, capacity, bus.

One pydantic-settings class for the package (env prefix ``GPUOPS_PIPELINE_``). Every
field says its unit and why its default; nothing is built at import time — the
composition in ``api/`` builds a :class:`PipelineSettings` and passes it down.
"""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class PipelineSettings(BaseSettings):
    """Knobs of :class:`pipeline.stream.FeaturePipeline` and the bus worker."""

    model_config = SettingsConfigDict(env_prefix="GPUOPS_PIPELINE_", extra="ignore")

    cadence_s: float = Field(
        60.0, gt=0,
        description="Scoring cadence in seconds of telemetry time: one FeatureBatch per tick. "
        "60 s keeps scoring cost ~1/60 of a 1 Hz fleet's samples while every precursor we "
        "predict on (ECC growth, thermal trend, link errors) unfolds over minutes.")
    bucket_s: float = Field(
        60.0, gt=0,
        description="Width in seconds of one ring-buffer bucket of window state. Windows are "
        "whole numbers of buckets; 60 s matches the cadence so the short window is one bucket "
        "and memory per GPU stays ~17 KB for a 30 min long window.")
    short_window_s: float = Field(
        60.0, gt=0,
        description="Short window in seconds: 'what is happening now' (level, spread, slope, "
        "rates). One minute averages 6-60 samples at the usual 1-10 s sampling interval.")
    long_window_s: float = Field(
        1800.0, gt=0,
        description="Long window in seconds: trends and slow counters (SBE/h, remaps/h). "
        "30 min sees a thermal drift or ECC growth well before the failures we target, "
        "which give 1 h of warning at most (spec/recording.md scoring).")
    allowed_lateness_s: float = Field(
        30.0, ge=0,
        description="Live only: a tick closes when the watermark passes its end plus this many "
        "seconds, so a collector a few sampling intervals behind its peers is not dropped. "
        "Replay reads in order and closes ticks at the window end with no lateness.")
    retain_silent_s: float = Field(
        600.0, ge=0,
        description="A GPU that stops reporting is still scored for this many seconds "
        "(feature sample_age_s grows), because going silent is itself the symptom of a GPU "
        "that fell off the bus. 10 min, then its row is dropped until it reports again; a GPU with no "
        "reading this long counts in its node's node_gpus_lost.")
    max_gpus_per_node: int = Field(
        64, gt=0, le=1024,
        description="Largest accepted GPU index + 1 on one node; a sample with a larger index "
        "is dead-lettered. 64 covers every current chassis (8-16 GPUs) with room, and bounds "
        "the (node, gpu) slot table.")
    expected_gpus: int = Field(
        1024, gt=0,
        description="Capacity hint: slots allocated up front (grows by doubling). 1024 GPUs "
        "cost ~17 MB of window state; a bigger fleet should set its size to avoid regrowth.")
    expected_ports: int = Field(
        1024, gt=0, description="Capacity hint for IB/RoCE ports (grows by doubling).")
    expected_nodes: int = Field(
        256, gt=0, description="Capacity hint for nodes (grows by doubling).")
    bus: str = Field(
        "inprocess",
        description="Bus back-end by name (pipeline.bus.BUSES): 'inprocess' runs without "
        "Kafka (embedded default), 'kafka' joins the scoring consumer group.")
    kafka_bootstrap: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers (host:port[,...]).")
    kafka_group: str = Field(
        "gpuops-scoring",
        description="Consumer group of the scoring workers; window state is per partition, "
        "so adding workers to this group scales scoring out.")
    poll_max_records: int = Field(
        500, gt=0,
        description="Messages per bus poll. 500 node messages of 8 GPUs is 4,000 samples: "
        "large enough to amortise Python overhead, small enough to keep latency low.")
    poll_timeout_s: float = Field(1.0, gt=0, description="Longest wait of one poll in seconds.")

    @model_validator(mode="after")
    def _windows_are_whole_buckets(self) -> "PipelineSettings":
        for name in ("cadence_s", "short_window_s", "long_window_s"):
            v = getattr(self, name)
            k = v / self.bucket_s
            if abs(k - round(k)) > 1e-9 or round(k) < 1:
                raise ValueError(f"{name}={v} must be a whole number (>= 1) of bucket_s={self.bucket_s}")
        if self.short_window_s > self.long_window_s:
            raise ValueError("short_window_s must not exceed long_window_s")
        if abs(self.short_window_s - self.cadence_s) > 1e-9:
            raise ValueError(f"short_window_s={self.short_window_s} must equal cadence_s={self.cadence_s}: each "
                             "tick adds its short window to the per-part baselines (pipeline.baselines) exactly once")
        return self

    @property
    def n_buckets(self) -> int:
        """Ring length: buckets in the long window."""
        return int(round(self.long_window_s / self.bucket_s))

    @property
    def n_short_buckets(self) -> int:
        """Buckets in the short window."""
        return int(round(self.short_window_s / self.bucket_s))
