"""People's actions through the API: ``gpuops drain|resume|requeue|reset|reboot NODE``, ``gpuops
actions``, ``gpuops approve|reject|cancel ID`` and ``gpuops verdict ID healthy|faulty``. Requests are dry
runs unless ``--no-dry-run``."""

from __future__ import annotations

from typing import Callable, List, Optional

import typer

from api.commands.remote import JsonOpt, TokenOpt, UrlOpt

ReasonOpt = typer.Option(..., "--reason", "-r", help="Why (required; recorded with the action).")
DryOpt = typer.Option(True, "--dry-run/--no-dry-run", help="Default: a dry run (nothing reaches the scheduler).")
ForceOpt = typer.Option(False, "--force", help="Override maintenance and, for resume, the verification window.")
NoteOpt = typer.Option("", "--note", "-n", help="A note recorded with the decision.")


def register(app: typer.Typer) -> None:
    for kind in ("drain", "resume", "requeue", "reboot"):
        app.command(kind)(_request(kind))
    app.command("reset")(reset)
    app.command("actions")(actions)
    for verb in ("approve", "reject", "cancel"):
        app.command(verb)(_decide(verb))
    app.command("verdict")(verdict)


def _send(kind: str, name: str, reason: str, gpu: Optional[int], dry_run: bool, force: bool, url: str,
          token: Optional[str], as_json: bool) -> None:
    from api.commands.remote import api, show_action

    with api(url, token) as c:
        rec = c.create_action(kind, name, reason, gpu=gpu, dry_run=dry_run, force=force)
    show_action(rec, as_json)


def _request(kind: str) -> Callable[..., None]:
    def request(name: str = typer.Argument(..., help="Node name."), reason: str = ReasonOpt,
                gpu: Optional[int] = typer.Option(None, "--gpu", min=0, help="GPU index."),
                dry_run: bool = DryOpt, force: bool = ForceOpt,
                url: str = UrlOpt, token: Optional[str] = TokenOpt, as_json: bool = JsonOpt) -> None:
        _send(kind, name, reason, gpu, dry_run, force, url, token, as_json)

    request.__name__ = kind
    request.__doc__ = {"drain": "Drain a node (no new jobs; running ones finish).",
                       "resume": "Return a node gpuops holds to service.",
                       "requeue": "Drain a node and requeue its jobs now.",
                       "reboot": "Reboot a node."}[kind] + " A dry run unless --no-dry-run."
    return request


def reset(name: str = typer.Argument(..., help="Node name."),
          gpu: int = typer.Option(..., "--gpu", min=0, help="GPU index to reset."),
          reason: str = ReasonOpt, dry_run: bool = DryOpt, force: bool = ForceOpt,
          url: str = UrlOpt, token: Optional[str] = TokenOpt, as_json: bool = JsonOpt) -> None:
    """Reset one GPU through the node agent. A dry run unless --no-dry-run."""
    _send("reset", name, reason, gpu, dry_run, force, url, token, as_json)


def actions(node: Optional[str] = typer.Option(None, "--node", help="Only this node."),
            state: Optional[List[str]] = typer.Option(None, "--state", help="Only these states (repeatable)."),
            kind: Optional[List[str]] = typer.Option(None, "--kind", help="Only these kinds (repeatable)."),
            actor: Optional[str] = typer.Option(None, "--actor", help="Only this actor (engine, operator:NAME)."),
            action_id: Optional[str] = typer.Option(None, "--id", help="One action, with its audit trail."),
            limit: int = typer.Option(50, "--limit", min=1, max=1000),
            url: str = UrlOpt, token: Optional[str] = TokenOpt, as_json: bool = JsonOpt) -> None:
    """Action records, newest first (or one with --id)."""
    from rich.markup import escape

    from api.commands.remote import action_table, api, console, print_json, when

    with api(url, token) as c:
        body = c.action(action_id) if action_id else c.actions(node=node, state=state, kind=kind, actor=actor,
                                                                  limit=limit)
    if as_json:
        print_json(body)
        return
    out = console()
    if action_id:
        out.print(action_table([body], title=f"action {body['id']}"))
        for h in body.get("history", []):
            out.print(f"  {when(h['at'])}  {h.get('from_state') or '-'} -> {h['to_state']}  "
                      f"{escape(h['actor'])}: {escape(h['note'])}")
        return
    out.print(action_table(body["actions"], title=f"{body['count']} actions"))


def _decide(verb: str) -> Callable[..., None]:
    def decide(action_id: str = typer.Argument(..., help="The action's id."), note: str = NoteOpt,
               url: str = UrlOpt, token: Optional[str] = TokenOpt, as_json: bool = JsonOpt) -> None:
        from api.commands.remote import api, show_action

        with api(url, token) as c:
            rec = getattr(c, verb)(action_id, note)
        show_action(rec, as_json)

    decide.__name__ = verb
    decide.__doc__ = {"approve": "Approve a proposed action (it runs at once).",
                      "reject": "Reject a proposed action.",
                      "cancel": "Cancel an action that has not started."}[verb]
    return decide


def verdict(action_id: str = typer.Argument(..., help="The action's id (a drain or reset gpuops took on a prediction)."),
            found: str = typer.Argument(..., metavar="healthy|faulty",
                                        help="healthy: the prediction was false; faulty: it came true."),
            note: str = NoteOpt, url: str = UrlOpt, token: Optional[str] = TokenOpt, as_json: bool = JsonOpt) -> None:
    """Say what you found on a node gpuops took out on a prediction. It counts towards the fleet's
    false-action budget: a fault class whose predictions keep ending healthy only alerts until that passes."""
    from api.commands.remote import api, show_action

    if found not in ("healthy", "faulty"):
        raise typer.BadParameter(f"{found!r}: say healthy (the prediction was false) or faulty (it came true)",
                                 param_hint="healthy|faulty")
    with api(url, token) as c:
        rec = c.verdict(action_id, found, note)
    show_action(rec, as_json)
