"""``gpuops simulate``: write a simulated fleet recording with ground-truth incidents."""

from __future__ import annotations

import time
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)


def simulate(
    out: Path = typer.Option(..., "--out", help="Recording directory to write (created)."),
    nodes: int = typer.Option(16, "--nodes", min=1, help="Number of GPU nodes."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", min=1, help="GPUs per node."),
    ports_per_node: int = typer.Option(8, "--ports-per-node", min=0, help="InfiniBand ports per node."),
    hours: float = typer.Option(24.0, "--hours", min=0.01, help="Telemetry time to simulate, hours."),
    interval: float = typer.Option(10.0, "--interval", min=0.1, help="Sampling interval, seconds."),
    seed: int = typer.Option(0, "--seed", help="Random seed (same seed, same fleet)."),
    rate_multiplier: float = typer.Option(
        150.0, "--rate-multiplier", min=0.0,
        help="Failure rate relative to field data (Llama 3: 3.8e-3 per node-day); 1 = field rate."),
    gzip_jsonl: bool = typer.Option(False, "--gzip", help="Write events/incidents as .jsonl.gz."),
    world: str = typer.Option(
        "home", "--world",
        help="home: one H100 fleet at --interval, as always. randomized: draw a world (generations, workloads, "
             "sampling, background, fault shapes) from --world-ranges; --interval and --rate-multiplier then "
             "come from the world. Recorded under 'world' in manifest.json."),
    world_ranges: str = typer.Option(
        "train", "--world-ranges",
        help="Ranges a randomized world is drawn from: train, a tuning-only tune-NAME, or a held-out "
             "shift-NAME (docs/simulator.md)."),
    bmc: bool = typer.Option(
        True, "--bmc/--no-bmc",
        help="Emit the nodes' BMC events: sensor readings every minute, SEL entries, and the power and thermal "
             "incidents' BMC precursors (docs/simulator.md). --no-bmc gives a seed's recording as made before "
             "BMC events existed; GPU and port rows are the same either way."),
    bmc_sensor_period: float = typer.Option(
        60.0, "--bmc-sensor-period", min=1.0,
        help="Seconds between two BMC sensor readings of a node (~5 events each): a slower cadence keeps a "
             "big fleet's events.jsonl small."),
    force: bool = typer.Option(False, "--force", help="Overwrite a non-empty output directory."),
) -> None:
    """Simulate a GPU fleet and write a recording (spec/recording.md) with incidents.jsonl."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from collector.simulator import SimConfig, simulate_recording

    console = Console(stderr=True)
    if out.exists() and any(out.iterdir()) and not force:
        raise typer.BadParameter(f"{out} exists and is not empty (use --force to overwrite)", param_hint="--out")
    if force and out.exists():
        import shutil
        shutil.rmtree(out)
    try:
        cfg = SimConfig(nodes=nodes, gpus_per_node=gpus_per_node, ports_per_node=ports_per_node, hours=hours,
                        interval_s=interval, seed=seed, rate_multiplier=rate_multiplier, bmc=bmc,
                        bmc_sensor_period_s=bmc_sensor_period)
        if world == "randomized":
            cfg = randomized_config(cfg, world_ranges)
        elif world != "home":
            raise ValueError(f"unknown --world {world!r}; valid: home, randomized")
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    t0 = time.perf_counter()
    with Progress(TextColumn("simulating"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeRemainingColumn(), console=console, transient=True) as bar:
        task = bar.add_task("sim", total=cfg.n_ticks)
        summary = simulate_recording(cfg, out, progress=lambda d, t: bar.update(task, completed=d),
                                     gzip_jsonl=gzip_jsonl)
    took = time.perf_counter() - t0
    print_summary(console, summary, cfg, out, took)


def randomized_config(cfg, ranges_name: str):  # noqa: ANN001, ANN201
    """*cfg* in a world drawn from the named ranges (app XIDs: every RESTART_APP code of the catalogue)."""
    from collector.simulator import draw_world, ranges_by_name, world_config

    return world_config(cfg, draw_world(cfg.seed, ranges_by_name(ranges_name), cfg.nodes))


def print_summary(console, summary, cfg, out: Path, took: float) -> None:  # noqa: ANN001
    """What happened in the fleet, per fault class."""
    from rich.table import Table

    node_days = cfg.nodes * cfg.hours / 24
    cadence = f"{cfg.interval_s:g} s"
    if cfg.world is not None:
        w = cfg.world
        cadence = (f"{'/'.join(f'{v:g}' for v in sorted(set(w.node_interval_s)))} s, "
                   f"{'+'.join(sorted(set(w.generation)))}, world {w.ranges.name}")
    t = Table(title=f"{cfg.nodes} nodes x {cfg.gpus_per_node} GPUs, {cfg.hours:g} h at {cadence} "
                    f"({node_days:.1f} node-days), seed {cfg.seed}")
    t.add_column("fault")
    t.add_column("incidents", justify="right")
    t.add_column("with warning", justify="right")
    t.add_column("without", justify="right")
    for fault, row in summary.by_fault().items():
        t.add_row(fault, str(row["incidents"]), str(row["predictable"]), str(row["incidents"] - row["predictable"]))
    console.print(t)
    console.print(f"{summary.gpu_samples:,} GPU samples, {summary.net_samples:,} port samples, "
                  f"{summary.events:,} events in {took:.1f} s "
                  f"({summary.gpu_samples / max(took, 1e-9):,.0f} GPU samples/s) -> {out}")
