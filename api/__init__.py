"""API: service composition, the FastAPI control API, scheduled jobs and the gpuops CLI."""
