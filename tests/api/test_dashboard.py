"""The dashboard's files as the API serves them: at /ui/ without a token, / redirects there, and
nothing on the page comes from elsewhere (no CDN: the machines it runs on may reach nothing)."""

from __future__ import annotations

import re

from api.routes.ui import WEB_ROOT


def test_the_root_redirects_to_the_dashboard(client):
    r = client.get("/", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/ui/"


def test_the_dashboard_page_and_its_files_are_served_without_a_token(client):
    page = client.get("/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for ref in re.findall(r'(?:src|href)="([^"#]+)"', page.text):
        r = client.get("/ui/" + ref)
        assert r.status_code == 200 and r.content, ref


def test_the_dashboard_loads_nothing_from_another_origin():
    for f in WEB_ROOT.iterdir():
        text = f.read_text(encoding="utf-8")
        assert not re.search(r"""(?:src|href|url|import|fetch)\s*[=(]\s*["']?(?:https?:)?//""", text), f.name


def test_the_dashboard_never_writes_api_text_as_html():
    js = (WEB_ROOT / "app.js").read_text(encoding="utf-8")
    assert "innerHTML" not in js and "outerHTML" not in js and "insertAdjacentHTML" not in js


def test_the_dashboard_is_not_in_the_openapi_document(client):
    paths = client.get("/openapi.json", headers={"Authorization": "Bearer admin-token-0123456789"}).json()["paths"]
    assert not any(p == "/" or p.startswith("/ui") for p in paths)
