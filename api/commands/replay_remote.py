"""``gpuops replay REC --remote``: the same replay run by the service, on a recording the server can read.

For on-call tooling and laptops without the recording or the model: the server replays with its own model
and policy (``POST /v1/replays``), this command follows the job's progress, then writes the report (and the
HTML page the server renders) where ``gpuops replay`` would. A ``--compare-policy`` file sends the settings
it sets, applied over the service's policy as a local replay applies them over ``--policy`` (mappings merged
key by key: :func:`remediation.config.policy_with`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import typer

#: how often the job is polled, s
POLL_S = 1.0


def remote_replay(recording: Path, report: Path, html: Optional[Path], compare_policy: list[Path], url: str,
                  token: Optional[str], console: Any) -> dict[str, Any]:
    """Run the replay on the service at *url*; write *report* (and *html*); return the report."""
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from api.commands.remote import api
    from remediation.config import PolicyConfigError, load_policy_overrides

    try:
        overrides = load_policy_overrides(compare_policy)
    except PolicyConfigError as e:
        console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
        raise typer.Exit(2) from None
    with api(url, token) as c:
        job = c.start_replay(str(recording), overrides or None)
        with Progress(TextColumn(f"replaying on {escape(url)}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
            task = bar.add_task("replay", total=1.0)
            while job["state"] not in ("succeeded", "failed"):
                time.sleep(POLL_S)
                job = c.replay(job["id"])
                bar.update(task, completed=float(job.get("progress") or 0.0))
        if job["state"] == "failed":
            console.print(f"[red]error:[/red] replay job {job['id']} failed: {escape(str(job.get('error')))}",
                          soft_wrap=True)
            raise typer.Exit(2)
        rep = c.replay_report(job["id"])
        report.write_text(json.dumps(rep, indent=1, default=str) + "\n")
        if html:
            html.write_text(c.replay_report_html(job["id"]), encoding="utf-8")
    return rep
