"""``gpuops demo``: the embedded default — simulate a small fleet, replay it, show what gpuops would do.

Needs no Kafka, no scheduler and no GPU: the fleet simulator writes a recording to a
temporary directory, which is replayed through the same pipeline, models and policy as
the live service (dry run), and scored against the simulator's ground truth next to
the rules-only baseline (what NVSentinel / NHC-style reactive tools do).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)


def demo(
    nodes: int = typer.Option(16, "--nodes", min=1, help="Simulated GPU nodes (8 GPUs each)."),
    hours: float = typer.Option(12.0, "--hours", min=1.0, help="Telemetry time to simulate, hours."),
    seed: int = typer.Option(54, "--seed", help="Simulator seed (the shipped model never saw seeds below 100; "
                                                "54 has every fault class)."),
    rate_multiplier: float = typer.Option(400.0, "--rate-multiplier", min=0.0,
                                          help="Failure rate x field data, so a short demo holds incidents."),
    model: Optional[Path] = typer.Option(None, "--model", help="Model directory (default: the shipped model)."),
    keep: Optional[Path] = typer.Option(None, "--keep", help="Keep the recording and reports in this directory."),
) -> None:
    """Simulate a small fleet, replay it through gpuops (dry run) and print what happened, per fault class."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    from api.replay import Replayer, build_report
    from collector.simulator import SimConfig, simulate_recording
    from models.bundle import ModelBundle, default_model_path
    from remediation.config import PolicyConfig

    console = Console()
    work = keep or Path(tempfile.mkdtemp(prefix="gpuops-demo-"))
    rec = work / "recording"
    cfg = SimConfig(nodes=nodes, hours=hours, seed=seed, rate_multiplier=rate_multiplier)
    with Progress(TextColumn("{task.description}"), BarColumn(), console=console, transient=True) as bar:
        t = bar.add_task("simulating fleet", total=cfg.n_ticks)
        simulate_recording(cfg, rec, progress=lambda d, n: bar.update(t, completed=d))
        t2 = bar.add_task("replaying through gpuops", total=1.0)
        mpath = model or default_model_path()
        bundle = ModelBundle.load(mpath)
        policy = PolicyConfig()
        result = Replayer(bundle, policy).run(rec, progress=lambda f: bar.update(t2, completed=f))
    report = build_report(rec, result, {"path": str(mpath)}, policy)
    (work / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    print_demo(console, report, cfg)
    if keep:
        from api.report_html import write_html_report
        write_html_report(report, work / "report.html")
        console.print(f"recording, report.json and report.html kept in {work}")


def print_demo(console, report: dict, cfg) -> None:  # noqa: ANN001
    """Per fault class: incidents, what gpuops caught (and how early), what the rules caught."""
    from rich.table import Table

    m, b = report["metrics"]["model"], report["metrics"]["rules_baseline"]
    t = Table(title=f"{cfg.nodes} nodes x 8 GPUs, {cfg.hours:g} h simulated (seed {cfg.seed}): "
                    "gpuops vs reactive rules", caption="early = caught >= 60 s before the failure")
    t.add_column("fault", no_wrap=True)
    for c in ("incidents", "warned", "caught", "early", "lead", "rules", "rules early"):
        t.add_column(c, justify="right")
    for fault, pm in m["per_class"].items():
        pb = b["per_class"][fault]
        if not pm["incidents"]:
            continue
        lead = pm["median_lead_s"]
        t.add_row(fault, str(pm["incidents"]), str(pm["predictable"]), str(pm["caught"]),
                  str(pm["caught_predictively"]), "-" if lead is None else (f"{lead:.0f}s" if abs(lead) < 60 else f"{lead / 60:.0f}m"),
                  str(pb["caught"]), str(pb["caught_predictively"]))
    console.print(t)
    apps = m["app_error_incidents"]
    console.print(f"application errors (the job's own fault, must be left alone): {apps}; "
                  f"gpuops actions on them: {m['actions_on_app_errors']}")

    def pct(v):  # noqa: ANN001, ANN202
        return "-" if v is None else f"{v:.0%}"

    console.print(f"gpuops: recall {pct(m['recall'])}, predictive recall {pct(m['predictive_recall'])}, "
                  f"false actions {m['false_actions']} ({m['false_actions_per_1k_node_days'] or 0:.1f} per 1,000 "
                  f"node-days)  |  rules: recall {pct(b['recall'])}, predictive {pct(b['predictive_recall'])}, "
                  f"false actions {b['false_actions']}")
    s = report["summary"]
    console.print(f"replayed {s['gpu_samples']:,} GPU samples at {s['gpu_samples_per_s']:,.0f} samples/s; "
                  f"{len(report['decisions'])} decisions (drain/reset/alert/resume), all dry-run")
