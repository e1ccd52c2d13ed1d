"""``gpuops replay``: push a recording through pipeline, models and policy; write the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from api.commands.remote import TokenOpt, UrlOpt


def register(app: typer.Typer) -> None:
    app.command("replay")(replay)


def replay(
    recording: Path = typer.Argument(..., help="Recording directory (spec/recording.md)."),
    report: Path = typer.Option(Path("report.json"), "--report", help="JSON report to write."),
    html: Optional[Path] = typer.Option(None, "--html", help="Also write an HTML report with plots."),
    model: Optional[Path] = typer.Option(None, "--model", help="Model directory (default: the shipped model)."),
    policy: Optional[Path] = typer.Option(None, "--policy", help="Policy YAML (default: built-in thresholds)."),
    cadence: Optional[float] = typer.Option(None, "--cadence", min=1.0, help="Scoring cadence, s of telemetry time."),
    rules_only: bool = typer.Option(False, "--rules-only", help="Use no trained model (the reactive baseline)."),
    safety: Optional[Path] = typer.Option(
        None, "--safety", help="Safety YAML (deploy/config/safety.example.yaml): replay through the dry-run "
        "engine with these limits; the report's `engine` section shows what they held back."),
    compare_policy: Optional[List[Path]] = typer.Option(
        None, "--compare-policy", metavar="YAML", help="Also decide with this policy on the same scores (the "
        "alternative is named by its file's stem; repeat for more): the report's `alternatives` section and the "
        "summary put it beside --policy, incident by incident. One replay, however many policies."),
    trace: Optional[List[str]] = typer.Option(
        None, "--trace", metavar="NODE[:GPU]", help="Write every tick's scores, rule, decision and features of "
        "this node (or one GPU of it) to --trace-out as CSV; repeat for more (docs/replay.md)."),
    trace_out: Path = typer.Option(Path("trace.csv"), "--trace-out", help="CSV the --trace rows go to."),
    trace_features: Optional[str] = typer.Option(
        None, "--trace-features", metavar="F1,F2,...", help="Only these feature columns in the trace (default: all; "
        "`python -m pipeline.features` lists them)."),
    remote: bool = typer.Option(
        False, "--remote", help="Have the service at --url replay it (the recording is a path on the server; its "
        "model and policy; --compare-policy files apply over its policy) and write its report here."),
    url: str = UrlOpt, token: Optional[str] = TokenOpt,
) -> None:
    """Replay a recording in telemetry time (dry run) and score the decisions against its incidents."""
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from api.replay import Replayer, build_report, headline
    from collector.recording import RecordingError
    from models.base import ModelError
    from models.bundle import ModelBundle, default_model_path
    from pipeline.settings import PipelineSettings
    from remediation.config import PolicyConfigError, load_policy_config, load_policy_files
    from remediation.safety import SafetyConfigError, load_safety_config

    console = Console(stderr=True)
    if remote:
        local = {"--model": model, "--policy": policy, "--cadence": cadence, "--rules-only": rules_only or None,
                 "--safety": safety, "--trace": trace, "--trace-features": trace_features}
        if clash := [k for k, v in local.items() if v]:
            console.print(f"[red]error:[/red] --remote replays with the service's model and policy: "
                          f"{', '.join(clash)} cannot go with it", soft_wrap=True)
            raise typer.Exit(2)
        from api.commands.replay_remote import remote_replay
        from api.replay import headline

        rep = remote_replay(recording, report, html, list(compare_policy or []), url, token, console)
        console.print(json.dumps(headline(rep), indent=1))
        console.print(f"report written to {report}" + (f" and {html}" if html else ""))
        return
    if html:  # checked before the replay, not after it (the report extra is optional)
        from api.extras import MissingExtra, require
        try:
            require("--html (the HTML report's plots)", "matplotlib")
        except MissingExtra as e:
            console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
            raise typer.Exit(2) from None
    tracer = None
    try:
        cfg = load_policy_config(policy)
        mpath = model or default_model_path()
        settings = PipelineSettings(**({"cadence_s": cadence, "bucket_s": cadence, "short_window_s": cadence}
                                       if cadence else {}))
        bundle = ModelBundle.rules_only() if rules_only else ModelBundle.load(mpath, pipeline=settings)
        engine = None
        if safety is not None:
            from api.replay import dry_run_engine
            engine = dry_run_engine(cfg, load_safety_config(safety))
        if trace:
            from api.replay_trace import TraceTarget, Tracer
            tracer = Tracer([TraceTarget.parse(t) for t in trace], trace_out,
                            [f.strip() for f in (trace_features or "").split(",") if f.strip()],
                            [r.name for r in bundle.rules.rules])
        elif trace_features:
            raise ValueError("--trace-features needs --trace NODE[:GPU] (the parts to trace)")
        replayer = Replayer(bundle, cfg, settings, engine=engine, trace=tracer,
                            alternatives=load_policy_files(compare_policy or [], cfg))
        with Progress(TextColumn("replaying"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                      TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True) as bar:
            task = bar.add_task("replay", total=1.0)
            result = replayer.run(recording, progress=lambda f: bar.update(task, completed=f))
        info = {"path": None if rules_only else str(mpath), "training": bundle.metadata.get("training", {}).get("recordings")}
        rep = build_report(recording, result, info, cfg)
        if engine is not None:
            rep["engine"] = engine_summary(engine[0].store.query(limit=10_000_000))  # final states
    except (RecordingError, ModelError, PolicyConfigError, SafetyConfigError, ValueError) as e:
        # one line, printed as is (a reason may hold "[...]", which rich would read as markup)
        console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
        raise typer.Exit(2) from None
    finally:
        if tracer is not None:
            tracer.close()
    report.write_text(json.dumps(rep, indent=1, default=str) + "\n")
    if html:
        from api.report_html import write_html_report
        write_html_report(rep, html)
    h = headline(rep)
    if "engine" in rep:
        h["engine"] = rep["engine"]
    console.print(json.dumps(h, indent=1))
    console.print(f"report written to {report}" + (f" and {html}" if html else ""))
    if tracer is not None:
        console.print(f"trace: {tracer.rows:,} rows ({len(tracer.features)} features) written to {trace_out}")
        if tracer.missing():
            said = ", ".join(f"{t.node}" + (f":{t.gpu}" if t.gpu is not None else "") for t in tracer.missing())
            console.print(f"[red]error:[/red] --trace: no scored GPU matched {escape(said)} (nodes here: "
                          f"{escape(', '.join(tracer.nodes[:5]))}{' ...' if len(tracer.nodes) > 5 else ''})",
                          soft_wrap=True)
            raise typer.Exit(2)


def engine_summary(actions: list) -> dict:
    """What the dry-run engine did: records by kind and final state, what held actions back (``blocked_by``,
    e.g. ``silence:<id>``, ``maintenance:<reservation>``), and those counts by cause (its prefix)."""
    from collections import Counter

    return {"actions": len(actions),
            "by_kind_state": dict(sorted(Counter(f"{a.kind.value}:{a.state.value}" for a in actions).items())),
            "blocked_by": dict(sorted(Counter(a.blocked_by for a in actions if a.blocked_by).items())),
            # suppressed decisions by cause: silence, maintenance, not_ours, stale, cap_held, ...
            "suppressed_by_cause": dict(sorted(Counter(
                a.blocked_by.split(":")[0] for a in actions
                if a.blocked_by and a.state.value in ("rejected", "proposed", "cancelled")).items()))}
