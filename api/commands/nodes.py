"""``gpuops nodes``, ``gpuops node NAME`` and ``gpuops coverage``: the fleet, one node, and the precursor signals
nodes do not send, from the API."""

from __future__ import annotations

from typing import Optional

import typer

from api.commands.remote import JsonOpt, TokenOpt, UrlOpt


def register(app: typer.Typer) -> None:
    app.command("nodes")(nodes)
    app.command("node")(node)
    app.command("coverage")(coverage)


def nodes(state: Optional[str] = typer.Option(None, "--state", help="Only ok, at_risk, held or unknown."),
          min_risk: Optional[float] = typer.Option(None, "--min-risk", min=0.0, max=1.0, help="Only at or above."),
          url: str = UrlOpt, token: Optional[str] = TokenOpt, as_json: bool = JsonOpt) -> None:
    """The fleet: every node's state, risk and top fault, riskiest first."""
    from rich.table import Table

    from api.commands.remote import api, console, print_json, state_markup, when

    with api(url, token) as c:
        body = c.nodes(state=state, min_risk=min_risk)
    if as_json:
        print_json(body)
        return
    rows = sorted(body["nodes"], key=lambda r: (-r["risk"], r["node"]))
    t = Table(title=f"{body['count']} nodes (scores at {when(body.get('ts'))} UTC)", title_justify="left")
    for col in ("node", "state", "risk", "fault", "gpu", "anomaly", "rule"):
        t.add_column(col, justify="right" if col in ("risk", "anomaly", "gpu") else "left")
    for r in rows:
        t.add_row(r["node"], state_markup(r["state"]), f"{r['risk']:.3f}", r.get("fault") or "", str(r["gpu"]),
                  f"{r['anomaly']:.3f}", "" if r.get("rule") is None else str(r["rule"]))
    console().print(t)


def node(name: str = typer.Argument(..., help="Node name."),
         url: str = UrlOpt, token: Optional[str] = TokenOpt, as_json: bool = JsonOpt) -> None:
    """One node: its score, the reasons and features behind it, history, events and actions."""
    from rich.markup import escape

    from api.commands.remote import action_table, api, console, print_json, state_markup, when

    with api(url, token) as c:
        n = c.node(name)
    if as_json:
        print_json(n)
        return
    out = console()
    out.print(f"[bold]{escape(n['node'])}[/bold]  {state_markup(n['state'])}  risk {n['risk']:.3f}  "
              f"fault {n.get('fault') or '-'} (GPU {n['gpu']})  anomaly {n['anomaly']:.3f}  at {when(n['ts'])} UTC")
    hold = n.get("hold")
    if hold:
        out.print(f"  held since {when(hold['since'])} UTC by {escape(hold['actor'])} ({hold['kind']}, "
                  f"{hold.get('fault') or '-'}): {escape(hold['reason'])}")
        if hold.get("gpus_reading") is not None:
            then = hold.get("gpus_when_taken_out")
            out.print(f"  GPUs reading {hold['gpus_reading']}, lost {hold.get('gpus_lost') or 0}"
                      + (f", {then} when taken out" if then is not None else ""))
        for w in hold.get("waiting_for") or ["nothing: it is resumed at the next tick"]:
            out.print("  resume waits for: " + escape(w))
    cap = n.get("retry_cap")
    if cap:
        out.print(f"  retry cap until {when(cap['until'])} UTC: {escape(cap['reason'])}")
    if n.get("blind_signals"):
        out.print(f"  does not send: {', '.join(n['blind_signals'])} (its faults of those classes are seen only when "
                  "they happen: gpuops coverage says what to enable)")
    for k, v in (n.get("reasons") or {}).items():
        out.print(f"  because ({escape(str(k))}): {escape(str(v))}")
    for k, v in (n.get("detail") or {}).items():
        out.print(f"  {escape(str(k))} = {escape(str(v))}")
    hist = n.get("history") or []
    if hist:
        out.print("  risk history: " + " ".join(f"{h['risk']:.2f}" for h in hist[-20:]))
    for e in (n.get("events") or [])[-10:]:
        out.print("  event: " + escape(", ".join(f"{k}={v}" for k, v in e.items() if k != "node")))
    if n.get("actions"):
        out.print(action_table(n["actions"], title="recent actions"))


def coverage(url: str = UrlOpt, token: Optional[str] = TokenOpt, as_json: bool = JsonOpt) -> None:
    """The precursor signals nodes do not send: per signal, the nodes, the faults it warns of, what to enable."""
    from rich.markup import escape
    from rich.table import Table

    from api.commands.remote import api, console, print_json, when

    with api(url, token) as c:
        body = c.coverage()
    if as_json:
        print_json(body)
        return
    t = Table(title=f"precursor signals not sent, {body['nodes_known']} nodes known (scores at {when(body.get('ts'))} "
              "UTC)", title_justify="left")
    for col in ("signal", "nodes", "warns of", "turn on"):
        t.add_column(col, justify="right" if col == "nodes" else "left")
    for s in body["signals"]:
        few = ", ".join(s["nodes"][:3]) + (f" (+{s['count'] - 3})" if s["count"] > 3 else "")
        t.add_row(s["signal"], f"{s['count']}" + (f": {escape(few)}" if s["count"] else ""), ", ".join(s["faults"]),
                  escape(s["enable"]) if s["count"] else "")
    console().print(t)
