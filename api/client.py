"""A small client of the control API for on-call tooling and the ``gpuops`` CLI.

``GpuopsClient(url, token)`` has one method per route and returns the decoded JSON; an
answer other than success raises :class:`ApiError` carrying the server's message (its
``{"error": {...}}`` body), and an unreachable server raises it with status 0. The token
is sent as a bearer header and never appears in an error or a repr.
"""

from __future__ import annotations

from typing import Any, Iterable

import httpx

#: s: the node list answers in ms; a replay report of a long recording may take a while to send
DEFAULT_TIMEOUT_S = 30.0


class ApiError(Exception):
    """The server refused or failed a request; ``status`` 0 when it could not be reached."""

    def __init__(self, status: int, message: str, code: str = "", detail: Any = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.detail = status, message, code, detail

    def __str__(self) -> str:
        return f"{self.message} (HTTP {self.status})" if self.status else self.message


class GpuopsClient:
    """See the module docstring. Use as a context manager, or call :meth:`close`."""

    def __init__(self, url: str, token: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s, transport=transport)

    def __repr__(self) -> str:
        return f"GpuopsClient({self.url!r})"

    def __enter__(self) -> "GpuopsClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None) -> Any:
        if params:
            params = {k: v for k, v in params.items() if v is not None and v != []}
        try:
            r = self._http.request(method, path, json=json, params=params)
        except httpx.HTTPError as e:
            raise ApiError(0, f"cannot reach the gpuops API at {self.url}: {e} (is `gpuops serve` running? "
                           "set --url or GPUOPS_URL)") from None
        if r.status_code >= 400:
            try:
                err = r.json()["error"]
                raise ApiError(r.status_code, str(err.get("message")), str(err.get("code", "")), err.get("detail"))
            except (ValueError, KeyError, TypeError):
                raise ApiError(r.status_code, f"{method} {path}: HTTP {r.status_code}: {r.text[:200]}") from None
        if r.headers.get("content-type", "").startswith("application/json"):
            return r.json()
        return r.text

    # ---- nodes --------------------------------------------------------------------------------

    def nodes(self, state: str | None = None, min_risk: float | None = None) -> dict[str, Any]:
        return self._call("GET", "/v1/nodes", params={"state": state, "min_risk": min_risk})

    def node(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/nodes/{_seg(name)}")

    def coverage(self) -> dict[str, Any]:
        return self._call("GET", "/v1/coverage")

    # ---- actions ------------------------------------------------------------------------------

    def actions(self, *, node: str | None = None, state: Iterable[str] | None = None, kind: Iterable[str] | None = None,
                actor: str | None = None, since: float | None = None, until: float | None = None,
                limit: int = 100, offset: int = 0) -> dict[str, Any]:
        return self._call("GET", "/v1/actions", params={
            "node": node, "state": list(state or []), "kind": list(kind or []), "actor": actor, "since": since,
            "until": until, "limit": limit, "offset": offset})

    def action(self, action_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/actions/{_seg(action_id)}")

    def create_action(self, kind: str, node: str, reason: str, *, gpu: int | None = None, dry_run: bool = True,
                      force: bool = False) -> dict[str, Any]:
        return self._call("POST", "/v1/actions", json={"kind": kind, "node": node, "reason": reason, "gpu": gpu,
                                                       "dry_run": dry_run, "force": force})

    def approve(self, action_id: str, note: str = "") -> dict[str, Any]:
        return self._call("POST", f"/v1/actions/{_seg(action_id)}/approve", json={"note": note})

    def reject(self, action_id: str, note: str = "") -> dict[str, Any]:
        return self._call("POST", f"/v1/actions/{_seg(action_id)}/reject", json={"note": note})

    def cancel(self, action_id: str, note: str = "") -> dict[str, Any]:
        return self._call("POST", f"/v1/actions/{_seg(action_id)}/cancel", json={"note": note})

    def verdict(self, action_id: str, verdict: str, note: str = "") -> dict[str, Any]:
        """A person's verdict on a prediction hold: ``healthy`` (it was false) or ``faulty`` (it came true)."""
        return self._call("POST", f"/v1/actions/{_seg(action_id)}/verdict", json={"verdict": verdict, "note": note})

    # ---- silences -----------------------------------------------------------------------------

    def create_silence(self, reason: str, *, nodes: Iterable[str] = (), selector: dict[str, str] | None = None,
                       fleet: bool = False, mutes: str = "both", duration_s: float | None = None,
                       ends_at: float | None = None, starts_at: float | None = None) -> dict[str, Any]:
        body = {"reason": reason, "nodes": list(nodes) or None, "selector": selector, "fleet": fleet,
                "mutes": mutes, "duration_s": duration_s, "ends_at": ends_at, "starts_at": starts_at}
        return self._call("POST", "/v1/silences", json={k: v for k, v in body.items() if v is not None})

    def silences(self, all: bool = False) -> dict[str, Any]:
        return self._call("GET", "/v1/silences", params={"all": "true" if all else None})

    def silence(self, silence_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/silences/{_seg(silence_id)}")

    def delete_silence(self, silence_id: str, note: str = "") -> dict[str, Any]:
        return self._call("DELETE", f"/v1/silences/{_seg(silence_id)}", json={"note": note} if note else None)

    # ---- engine -------------------------------------------------------------------------------

    def engine(self) -> dict[str, Any]:
        return self._call("GET", "/v1/engine")

    def engine_shadow(self) -> dict[str, Any]:
        return self._call("GET", "/v1/engine/shadow")

    def engine_do(self, verb: str, note: str = "") -> dict[str, Any]:
        """``arm``, ``disarm``, ``pause`` or ``resume``."""
        if verb not in ("arm", "disarm", "pause", "resume"):
            raise ValueError(f"unknown engine verb {verb!r}: arm, disarm, pause or resume")
        return self._call("POST", f"/v1/engine/{verb}", json={"note": note})

    def breaker(self) -> dict[str, Any]:
        return self._call("GET", "/v1/engine/breaker")

    def reset_breaker(self, note: str) -> dict[str, Any]:
        return self._call("POST", "/v1/engine/breaker/reset", json={"note": note})

    # ---- models and replays -------------------------------------------------------------------

    def models(self) -> dict[str, Any]:
        return self._call("GET", "/v1/models")

    def model_metrics(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/models/{_seg(name)}/metrics")

    def activate_model(self, name: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/models/{_seg(name)}/activate")

    def train(self, recordings: list[str], name: str | None = None, seed: int = 0,
              val_fraction: float = 0.3) -> dict[str, Any]:
        return self._call("POST", "/v1/models/train", json={"recordings": recordings, "name": name, "seed": seed,
                                                            "val_fraction": val_fraction})

    def training_job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/models/train/{_seg(job_id)}")

    def start_replay(self, recording: str, compare_policies: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
        """Start a replay on the server; *compare_policies*: name -> settings over the service's policy."""
        body: dict[str, Any] = {"recording": recording}
        if compare_policies:
            body["compare_policies"] = compare_policies
        return self._call("POST", "/v1/replays", json=body)

    def replays(self) -> dict[str, Any]:
        return self._call("GET", "/v1/replays")

    def replay(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/replays/{_seg(job_id)}")

    def replay_report(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/replays/{_seg(job_id)}/report")

    def replay_report_html(self, job_id: str) -> str:
        """The report as one HTML page (the server renders it; 501 without matplotlib there)."""
        return self._call("GET", f"/v1/replays/{_seg(job_id)}/report.html")

    # ---- health -------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/healthz")

    def ready(self) -> dict[str, Any]:
        return self._call("GET", "/readyz")

    def metrics(self) -> str:
        return self._call("GET", "/metrics")


def _seg(value: str) -> str:
    """One path segment, escaped (an id or name never changes which route is called)."""
    from urllib.parse import quote

    return quote(str(value), safe="")
