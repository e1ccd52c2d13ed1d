"""Silences through the API: ``gpuops silence NODE... --for 2h --reason "..."``, ``gpuops silences``,
``gpuops unsilence ID``. While a silence is in force gpuops records what it would have done on those
nodes (``blocked_by: silence:<id>``) and does nothing."""

from __future__ import annotations

import re
from typing import Any, List, Optional

import typer

from api.commands.remote import JsonOpt, TokenOpt, UrlOpt

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw]?)")


def register(app: typer.Typer) -> None:
    app.command("silence")(silence)
    app.command("silences")(silences)
    app.command("unsilence")(unsilence)


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``2h``, ``1d``, ``1w`` or a sum (``1h30m``) as seconds."""
    t = text.strip().lower()
    parts = _DURATION.findall(t)
    if not t or "".join(n + u for n, u in parts) != t:
        raise typer.BadParameter(f"{text!r} is not a duration: use e.g. 90s, 30m, 2h, 1d or 1h30m")
    return sum(float(n) * _UNITS[u or "s"] for n, u in parts)


def silence(nodes: List[str] = typer.Argument(None, help="Node names (or use --selector / --fleet)."),
            duration: str = typer.Option(..., "--for", help="How long: 30m, 2h, 1d (at most the service's "
                                         "max_silence_s)."),
            reason: str = typer.Option(..., "--reason", "-r", help="What work is going on (required)."),
            mutes: str = typer.Option("both", "--mutes", help="actions, alerts or both."),
            selector: Optional[List[str]] = typer.Option(None, "--selector", "-l",
                                                         help="KEY=VALUE (partition, rack, pool); repeatable."),
            fleet: bool = typer.Option(False, "--fleet", help="Silence the whole fleet."),
            url: str = UrlOpt, token: Optional[str] = TokenOpt, as_json: bool = JsonOpt) -> None:
    """Silence nodes: gpuops acts on (or alerts about) nothing there until the silence ends."""
    from api.commands.remote import api, print_json

    sel: dict[str, str] = {}
    for item in selector or ():
        key, eq, value = item.partition("=")
        if not eq:
            raise typer.BadParameter(f"--selector {item!r}: expected KEY=VALUE (e.g. rack=r12)")
        sel[key.strip()] = value.strip()
    seconds = parse_duration(duration)
    with api(url, token) as c:
        got = c.create_silence(reason, nodes=nodes or (), selector=sel or None, fleet=fleet, mutes=mutes,
                               duration_s=seconds)
    if as_json:
        print_json(got)
        return
    from api.commands.remote import console

    out = console()
    out.print(_table([got], f"silence {got['id']}"))
    out.print(f"end it early: gpuops unsilence {got['id']}")


def silences(all: bool = typer.Option(False, "--all", help="Include expired and deleted silences."),
             url: str = UrlOpt, token: Optional[str] = TokenOpt, as_json: bool = JsonOpt) -> None:
    """Silences in force (or yet to start), newest first."""
    from api.commands.remote import api, console, print_json

    with api(url, token) as c:
        body = c.silences(all=all)
    if as_json:
        print_json(body)
        return
    console().print(_table(body["silences"], f"{body['count']} silences"))


def unsilence(silence_id: str = typer.Argument(..., help="The silence's id."),
              note: str = typer.Option("", "--note", "-n", help="A note recorded with the deletion."),
              url: str = UrlOpt, token: Optional[str] = TokenOpt, as_json: bool = JsonOpt) -> None:
    """End a silence now (it is kept in the audit, marked deleted by you)."""
    from api.commands.remote import api, console, print_json

    with api(url, token) as c:
        got = c.delete_silence(silence_id, note)
    if as_json:
        print_json(got)
        return
    console().print(_table([got], f"silence {got['id']} ended"))


def _table(rows: list[dict[str, Any]], title: str) -> Any:
    from rich.markup import escape
    from rich.table import Table

    from api.commands.remote import when

    t = Table(title=title, title_justify="left")
    for col in ("id", "scope", "mutes", "state", "starts (UTC)", "ends (UTC)", "author", "reason"):
        t.add_column(col, no_wrap=col != "reason", overflow="fold", min_width=20 if col == "reason" else None)
    for s in rows:
        scope = ("fleet" if s["fleet"] else ",".join(s["nodes"]) if s["nodes"]
                 else ",".join(f"{k}={v}" for k, v in sorted(s["selector"].items())))
        state = ("deleted" if s.get("deleted_at") else "active" if s.get("active") else "not in force")
        t.add_row(s["id"], escape(scope), s["mutes"], state, when(s["starts_at"]), when(s["ends_at"]),
                  escape(s["author"]), escape(s["reason"]))
    return t
