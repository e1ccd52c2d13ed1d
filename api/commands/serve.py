"""``gpuops serve``: the always-on service — scoring, the engine (one leader), the jobs and the API.

With no ``--config`` it runs the embedded default: everything in this process on
127.0.0.1 with no external service (the simulated fleet, the in-process bus, SQLite, the
dry-run adapter), and prints the URL and an admin token, as Jupyter does. docs/serve.md
describes the parts, the config file and the shutdown.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)


def serve(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="Service config YAML "
                                          "(deploy/config/gpuops.example.yaml). None: the embedded default."),
    host: Optional[str] = typer.Option(None, "--host", help="API address (overrides the config)."),
    port: Optional[int] = typer.Option(None, "--port", help="API port (overrides the config; 0: any free port)."),
) -> None:
    """Run gpuops as a service: live scoring, the remediation engine, scheduled jobs and the API."""
    from api.extras import MissingExtra, require

    try:   # a node agent's install (the base one) lacks the service's packages: say so first
        require("gpuops serve", "pandas", "sklearn", "numba", "fastapi", "uvicorn", "sqlalchemy")
    except MissingExtra as e:
        typer.echo(f"gpuops serve: {e}", err=True)
        raise typer.Exit(2) from None
    run_service(config, host=host, port=port)


def run_service(config: Path | None, *, host: str | None = None, port: int | None = None, **service_kw: Any) -> None:
    """Load the config, start the service, print where it is, run until SIGTERM/SIGINT."""
    import logging

    from api.config import ServiceConfigError, load_service_config
    from api.service import Service

    for noisy in ("apscheduler", "alembic", "kafka"):     # every job run, migration step, fetch: not news
        logging.getLogger(noisy).setLevel(logging.WARNING)

    try:
        cfg = load_service_config(config, host=host, port=port)
    except ServiceConfigError as e:
        typer.echo(f"gpuops serve: {e}", err=True)
        raise typer.Exit(2) from None
    if cfg.embedded and config is None:
        import tempfile

        cfg = cfg.model_copy(update={"state_dir": Path(tempfile.mkdtemp(prefix="gpuops-serve-"))})
    service = Service(cfg, **service_kw).start()
    mode = ("embedded default: simulated fleet of "
            f"{cfg.simulate.nodes} nodes at {cfg.simulate.speedup:g}x, dry run" if cfg.embedded
            else f"Kafka {cfg.kafka_bootstrap}, adapter {cfg.adapter.name}"
            f"{' (ARMED)' if service.engine.armed else ' (dry run until armed)'}")
    typer.echo(f"gpuops serving on {service.url}  ({mode}; replica {cfg.replica}; store "
               f"{cfg.resolved_store_url.split('@')[-1]})")
    if service.admin_token:
        typer.echo(f"    {service.url}/v1/nodes  with  Authorization: Bearer {service.admin_token}")
        typer.echo(f"    admin token: {service.admin_token}")
    sys.stdout.flush()
    service.run_until_signalled()
