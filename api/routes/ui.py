"""The dashboard: static files in ``api/web/`` served at ``/ui/``; ``/`` redirects there.

Plain HTML, JavaScript and CSS with no build step and nothing fetched from elsewhere
(docs/dashboard.md). The page asks for a token once and sends it as a bearer token on every
call to ``/v1``; the files themselves hold no data, so they are served without a token.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

#: the dashboard's files
WEB_ROOT = Path(__file__).resolve().parent.parent / "web"


def mount(app: FastAPI, web_root: Path = WEB_ROOT) -> None:
    """Serve *web_root* at ``/ui/`` and redirect ``/`` to it."""

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=307)

    app.mount("/ui", StaticFiles(directory=web_root, html=True), name="ui")
