"""What the people's commands share: the API's URL and token, the client, error exit, output.

The URL and token come from ``--url``/``--token`` or ``GPUOPS_URL``/``GPUOPS_TOKEN``; the
token is never printed (not in ``--help``, not in errors). A refused request exits 2 with
the server's message on stderr; ``--json`` prints the server's answer as is, for scripts.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import typer

#: where `gpuops serve` listens by default
DEFAULT_URL = "http://127.0.0.1:8080"

UrlOpt = typer.Option(DEFAULT_URL, "--url", envvar="GPUOPS_URL", help="The gpuops API (env GPUOPS_URL).")
TokenOpt = typer.Option(None, "--token", envvar="GPUOPS_TOKEN", show_default=False, show_envvar=False,
                        help="Bearer token (env GPUOPS_TOKEN; `gpuops serve` prints one at start-up).")
JsonOpt = typer.Option(False, "--json", help="Print the server's JSON answer (for scripts).")


@contextmanager
def api(url: str, token: Optional[str]) -> Iterator[Any]:
    """A client for the command; an :class:`~api.client.ApiError` exits 2 with the server's message."""
    from rich.console import Console
    from rich.markup import escape

    from api.client import ApiError, GpuopsClient

    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        logging.getLogger("httpx").setLevel(logging.WARNING)     # one INFO line per request otherwise
    client = GpuopsClient(url, token)
    try:
        yield client
    except ApiError as e:
        Console(stderr=True).print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)
        raise typer.Exit(2) from None
    finally:
        client.close()


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=1, default=str) + "\n")


def console() -> Any:
    from rich.console import Console

    return Console()


def when(ts: Optional[float]) -> str:
    """A wall time, s since the epoch, as UTC text ('' for none)."""
    if ts is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(ts)))


def action_table(actions: list[dict[str, Any]], title: str = "actions") -> Any:
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for col in ("id", "node", "kind", "state", "gpu", "dry run", "actor", "created (UTC)", "reason"):
        # short columns keep their width; the reason takes what is left and wraps
        t.add_column(col, no_wrap=col != "reason", overflow="fold", min_width=30 if col == "reason" else None)
    for a in actions:
        # an escalation takes further a node gpuops already holds: the same incident, not a new take-out
        kind = a["kind"] + (" (escalation)" if a.get("escalates") else "")
        t.add_row(a["id"], a["node"], kind, _state(a["state"]), "" if a.get("gpu") is None else str(a["gpu"]),
                  "yes" if a.get("dry_run") else "NO", a["actor"], when(a.get("created_at")),
                  _esc(a.get("reason", "") + (f" [blocked: {a['blocked_by']}]" if a.get("blocked_by") else "")
                       + (f" [verdict: {a['verdict']}]" if a.get("verdict") else "")))
    return t


def _esc(text: str) -> str:
    from rich.markup import escape

    return escape(text)


_COLORS = {"proposed": "yellow", "approved": "cyan", "executing": "cyan", "succeeded": "green", "verified": "green",
           "failed": "red", "rejected": "magenta", "cancelled": "dim", "at_risk": "yellow", "held": "magenta",
           "unknown": "red", "ok": "green"}


def _state(s: str) -> str:
    c = _COLORS.get(s)
    return f"[{c}]{s}[/{c}]" if c else s


state_markup = _state


def show_action(rec: dict[str, Any], as_json: bool) -> None:
    """One action after a request or decision."""
    if as_json:
        print_json(rec)
        return
    c = console()
    c.print(action_table([rec], title=f"action {rec['id']}"))
    if rec.get("error"):
        c.print(f"[red]error:[/red] {_esc(str(rec['error']))}")
    c.print(f"poll it: gpuops actions --id {rec['id']}")
