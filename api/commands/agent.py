"""``gpuops agent``: the node agent (sources → buffer → Kafka or stdout), composed here.

``gpuops agent --once --sink stdout`` prints one JSON object per record (``type`` =
``gpu`` | ``net`` | ``event``) and exits; without ``--once`` it samples every
``--interval`` seconds until SIGTERM / SIGINT, then publishes its backlog (bounded) and
exits. Flags override ``GPUOPS_AGENT_*`` environment variables (``AgentSettings``).
A source or sink that cannot start is a clear error and exit status 2.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Optional

import typer

log = logging.getLogger("gpuops.agent")


def register(app: typer.Typer) -> None:
    """Add the ``agent`` command to the CLI."""
    app.command("agent")(agent)


def compose_agent(settings: Any, once: bool = False, nvml: Any = None, sink: Any = None,
                  gpu_ops: Any = None) -> Any:
    """Build sources, sink and :class:`~collector.agent.Agent` from *settings*.

    NVML is built first when selected, so the kernel-log source resolves XID PCI ids to
    the same GPU indexes NVML uses. With ``commands_enabled`` (and not *once*) the
    command consumer is attached, resetting GPUs through *gpu_ops* (default: NVML and
    nvidia-smi). Raises ``PermanentSourceError`` / ``SinkConfigError`` /
    ``CommandKeyError`` / ``GpuOpsError``.
    """
    from collector.agent import Agent
    from collector.sinks.base import sink_class
    from collector.sources.base import SourceOptions, build_sources, source_class

    names = settings.source_names
    for name in names:
        source_class(name)  # an unknown name fails before anything is opened
    options = SourceOptions(node=settings.node, sysfs_root=settings.sysfs_root, kmsg_path=settings.kmsg_file,
                            dcgm_url=settings.dcgm_url, dcgm_timeout_s=settings.dcgm_timeout_s, once=once,
                            kmsg_from_start=settings.kmsg_from_start, bmc_host=settings.bmc_host,
                            bmc_port=settings.bmc_port, bmc_user=settings.bmc_user,
                            bmc_password_file=settings.bmc_password_file, bmc_state_file=settings.bmc_state_file,
                            bmc_timeout_s=settings.bmc_timeout_s, redfish_url=settings.redfish_url,
                            redfish_user=settings.redfish_user, redfish_password_file=settings.redfish_password_file,
                            redfish_ca_file=settings.redfish_ca_file, redfish_tls_verify=settings.redfish_tls_verify,
                            redfish_skip_chassis=settings.redfish_skip_patterns)
    sources: list[Any] = []
    try:
        if "nvml" in names:
            nv, index = _start_nvml(settings, nvml)
            sources.append(nv)
            options = dataclasses.replace(options, gpu_index_by_pci=index)
        rest = build_sources([n for n in names if n != "nvml"], options)
        by_name = {s.name: s for s in sources + rest}
        sources = [by_name[n] for n in names]
        if sink is None:
            sink = sink_class(settings.sink).from_settings(settings)
        the_agent = Agent(settings, sources, sink)
        if "nvml" in names:
            the_agent.health_extras["nvml"] = lambda: _nvml_health(nv)
        if "redfish" in names:
            the_agent.health_extras["redfish"] = by_name["redfish"].health
        if "dcgm" in names:
            the_agent.health_extras["dcgm"] = by_name["dcgm"].health
        if settings.commands_enabled and not once:
            from collector.command_loop import attach_commands

            attach_commands(the_agent, gpu_ops, nvml=nvml)
    except BaseException:
        for s in sources:
            s.close()
        raise
    return the_agent


def _nvml_health(nv: Any) -> dict[str, Any]:
    """The health record's ``nvml`` section: the GPUs NVML reports lost (off the bus), which publish no rows."""
    from collector.source_guard import StartingSource

    src = nv.started if isinstance(nv, StartingSource) else nv
    return {"gpus_lost": sorted(getattr(src, "lost", ()))}


def _start_nvml(settings: Any, nvml: Any) -> tuple[Any, dict[str, int]]:
    """``(NvmlSource, its PCI map)``; or, when NVML has not started within ``source_stall_s`` (a GPU
    off the bus can hold the driver for minutes), a source that joins once it has: the agent
    starts the other sources meanwhile, and the kernel log maps XIDs to GPUs in sysfs PCI order.
    A start that fails in time (no driver) raises, as any source that cannot start does."""
    from collector.source_guard import start_bounded
    from collector.sources.nvml import NvmlSource

    def build() -> tuple[Any, dict[str, int]]:
        nv = NvmlSource(settings.node, nvml=nvml)
        return nv, nv.gpu_index_by_pci()

    done, got = start_bounded("nvml", build, settings.source_stall_s, source_of=lambda built: built[0])
    if done:
        return got
    log.warning("NVML has not started within %g s (a GPU off the bus can hold the driver); starting the other "
                "sources, nvml joins when it answers", settings.source_stall_s)
    return got, {}


def agent(
    once: bool = typer.Option(False, "--once", help="Sample once, publish, exit (with --kmsg-file: the whole file)."),
    sink: Optional[str] = typer.Option(None, "--sink", help="kafka | stdout (stdout: one JSON record per line)."),
    sources: Optional[str] = typer.Option(None, "--sources", help="Comma-separated: nvml,infiniband,kmsg,dcgm,ipmi,redfish."),
    sysfs_root: Optional[Path] = typer.Option(None, "--sysfs-root", help="sysfs root (default /sys)."),
    kmsg_file: Optional[Path] = typer.Option(None, "--kmsg-file", help="Kernel log file instead of /dev/kmsg."),
    dcgm_url: Optional[str] = typer.Option(None, "--dcgm-url", help="dcgm-exporter /metrics URL or a scrape file."),
    bmc_host: Optional[str] = typer.Option(None, "--bmc-host", help="The node's BMC for the ipmi source (the "
                                           "password: --bmc-password-file setting or $IPMI_PASSWORD, never a flag)."),
    redfish_url: Optional[str] = typer.Option(None, "--redfish-url", help="Redfish root of the node's BMC."),
    node: Optional[str] = typer.Option(None, "--node", help="Node name (default: short host name)."),
    interval: Optional[float] = typer.Option(None, "--interval", min=0.01, help="Seconds between samples."),
    bootstrap: Optional[str] = typer.Option(None, "--bootstrap", help="Kafka bootstrap host:port[,…]."),
    health_file: Optional[str] = typer.Option(None, "--health-file", help="Health JSON path ('' disables)."),
    wire_format: Optional[str] = typer.Option(None, "--wire-format", help="json (default) | arrow (columnar, faster "
                                              "to score: docs/scaling.md)."),
    publish_every_ticks: Optional[int] = typer.Option(
        None, "--publish-every-ticks", min=1, help="Samples per message: one message per N sampling ticks "
        "(N x interval must stay under the scorers' allowed lateness)."),
) -> None:
    """Run the node agent: sample GPUs, HCAs, kernel log and dcgm-exporter; publish to Kafka."""
    from pydantic import ValidationError

    from collector.agent_settings import AgentSettings
    from collector.commands import CommandKeyError
    from collector.gpu_reset import GpuOpsError
    from collector.sinks.base import SinkError
    from collector.sources.base import SourceError

    overrides = {k: v for k, v in dict(sink=sink, sources=sources, sysfs_root=sysfs_root, kmsg_file=kmsg_file,
                                       dcgm_url=dcgm_url, bmc_host=bmc_host, redfish_url=redfish_url, node=node, interval_s=interval, bootstrap=bootstrap,
                                       health_file=health_file, wire_format=wire_format,
                                       publish_every_ticks=publish_every_ticks).items() if v is not None}
    if once and health_file is None:
        overrides["health_file"] = None  # a one-shot debugging run leaves no files behind
    try:
        settings = AgentSettings(**overrides)
        the_agent = compose_agent(settings, once=once)
    except (ValidationError, SourceError, SinkError, CommandKeyError, GpuOpsError) as e:
        typer.echo(f"gpuops agent: cannot start: {e}", err=True)
        raise typer.Exit(2) from None
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        # kafka-python logs every refused connection at ERROR; the agent reports outages itself
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
    if once:
        ok = the_agent.run_once()
        if not ok:
            typer.echo(f"gpuops agent: {len(the_agent.buffer)} messages not published "
                       f"({the_agent.last_publish_error})", err=True)
        errors = the_agent.health()["source_errors"]
        if errors:
            typer.echo(f"gpuops agent: sources failed: {errors}", err=True)
        raise typer.Exit(0 if ok and not errors else 1)
    stop = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        log.info("received %s; flushing and stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    log.info("agent on %s: sources %s, sink %s, every %.1f s; commands %s", settings.node,
             ",".join(settings.source_names), settings.sink, settings.interval_s,
             f"on ({settings.command_topic})" if settings.commands_enabled else "off")
    the_agent.run(stop)
    sys.stdout.flush()
