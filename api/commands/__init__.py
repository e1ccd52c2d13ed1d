"""One module per `gpuops` subcommand; each exposes ``register(app)``."""
