"""The ``gpuops`` command line: one subcommand per module of :mod:`api.commands`.

The Typer app is built in :func:`build_cli` (never at import time); each command
module exposes ``register(app)`` and imports its heavy dependencies lazily, so
``gpuops --help`` stays fast.
"""

from __future__ import annotations

import importlib
import logging

import typer

#: Command modules, in help order. A module absent from this checkout is skipped (not built yet);
#: any other import error inside a command module is raised.
COMMAND_MODULES = ("serve", "demo", "simulate", "replay", "train", "agent", "nodes", "actions", "silences",
                   "engine")


def build_cli() -> typer.Typer:
    """Assemble the CLI from the command modules."""
    app = typer.Typer(
        name="gpuops",
        help="Predict GPU-cluster hardware failures from telemetry and remediate them safely.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )

    @app.callback()
    def _root(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log debug detail to stderr.")) -> None:
        logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(f"api.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"api.commands.{name}":
                continue  # command not built yet in this checkout
            raise
        mod.register(app)
    return app


def main() -> None:
    """Console-script entry point."""
    build_cli()()


if __name__ == "__main__":
    main()
