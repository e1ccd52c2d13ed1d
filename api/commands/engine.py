"""``gpuops engine [status|arm|disarm|pause|resume|breaker-reset|shadow]``: the remediation engine's switches,
and what its shadow policies would have done."""

from __future__ import annotations

import enum
from typing import Optional

import typer

from api.commands.remote import JsonOpt, TokenOpt, UrlOpt


class Verb(str, enum.Enum):
    status = "status"
    arm = "arm"
    disarm = "disarm"
    pause = "pause"
    resume = "resume"
    breaker_reset = "breaker-reset"
    shadow = "shadow"


def register(app: typer.Typer) -> None:
    app.command("engine")(engine)


def engine(verb: Verb = typer.Argument(Verb.status, help="What to do (arm, disarm, breaker-reset: admin)."),
           note: str = typer.Option("", "--note", "-n", help="Why (required for breaker-reset)."),
           url: str = UrlOpt, token: Optional[str] = TokenOpt, as_json: bool = JsonOpt) -> None:
    """Show the engine (armed, paused, breaker, held nodes) or change its switches; `shadow`: the shadow policies'
    decisions beside the live policy's (never carried out)."""
    from rich.markup import escape

    from api.commands.remote import api, console, print_json

    with api(url, token) as c:
        if verb is Verb.shadow:
            sh = c.engine_shadow()
            if as_json:
                print_json(sh)
            else:
                print_shadow(sh)
            return
        if verb is Verb.breaker_reset:
            if not note.strip():
                console().print("[red]error:[/red] breaker-reset needs --note saying why it is safe")
                raise typer.Exit(2)
            c.reset_breaker(note)
            st = c.engine()
        elif verb is Verb.status:
            st = c.engine()
        else:
            st = c.engine_do(verb.value, note)
    if as_json:
        print_json(st)
        return
    br = st.get("breaker") or {}
    out = console()
    out.print(f"automation: {'[red bold]ARMED[/red bold]' if st['armed'] else '[green]disarmed (dry run)[/green]'}"
              f"{'  [yellow]PAUSED[/yellow]' if st['paused'] else ''}  adapter {escape(st['adapter'])}  "
              f"{'leader' if st.get('leader') else 'standby'}")
    out.print("breaker: " + (f"[red]OPEN[/red] ({escape(str(br.get('why', '')))})" if br.get("open") else "closed"))
    out.print(f"held nodes ({len(st['held'])}): {escape(', '.join(st['held'])) or '-'}")
    out.print(budget_line(st.get("budget")))
    if st.get("counts"):
        out.print("counts: " + ", ".join(f"{k}={v}" for k, v in sorted(st["counts"].items())))


def budget_line(b: dict | None) -> str:
    """The false-action budget in a line or a few: prediction holds per class that ended healthy (and
    that came true) in its window, over the fleet's node-days, and the classes it brakes."""
    from rich.markup import escape

    if not b:
        return "false-action budget: off"
    if not b.get("per_1k_node_days"):
        return "false-action budget: off (false_budget_per_1k_node_days 0)"
    head = (f"false-action budget: {b['per_1k_node_days']:g} per 1,000 node-days per class, "
            f"{b['node_days']:.0f} node-days in the last {b['window_s'] / 86400:.3g} d")
    per = ", ".join(f"{f} {c['unconfirmed']} ended healthy / {c['confirmed']} came true"
                    for f, c in sorted(b.get("outcomes", {}).items()))
    lines = [head + (f"; prediction holds: {escape(per)}" if per else "; no prediction hold has ended")]
    for f, why in sorted(b.get("braked", {}).items()):
        lines.append(f"  [red]BRAKED[/red] {escape(f)}: {escape(why)}")
    return "\n".join(lines)


def print_shadow(sh: dict) -> None:
    """The shadow report as a table: per policy, its decisions by action, and its drains by fault class."""
    from rich.markup import escape
    from rich.table import Table

    from api.commands.remote import console

    out = console()
    if not sh["shadows"]:
        out.print("no shadow policies: add shadow_policies to the service config (docs/engine.md)")
        return
    if not sh["leader"]:
        out.print("[yellow]this replica is a standby: only the leader decides; ask it[/yellow]")
    actions = ("drain", "reset", "requeue", "alert", "resume")
    t = Table("policy", "decisions", *actions, "drains by fault", title=f"{sh['ticks']} ticks since {sh['since']}")
    for name, p in [("live", sh["live"]), *sh["shadows"].items()]:
        by = p["by_action_and_fault"]
        drains = ", ".join(f"{f} {n}" for f, n in sorted(by.get("drain", {}).items())) or "-"
        t.add_row(escape(name), str(p["decisions"]), *(str(sum(by.get(a, {}).values())) for a in actions),
                  escape(drains))
    out.print(t)
