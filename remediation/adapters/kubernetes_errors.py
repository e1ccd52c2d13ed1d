"""What a failed Kubernetes API call means: unknown node, retry later, or do not retry.

404 on a node -> :class:`UnknownNode`; 409/429/5xx, connection errors and timeouts ->
:class:`TransientAdapterError` (with the server's ``Retry-After`` where it gave one); 401/403
name the RBAC the service account needs; 422 and other 4xx -> :class:`PermanentAdapterError`.
"""

from __future__ import annotations

import json
from typing import Any

from remediation.adapters.base import AdapterError, PermanentAdapterError, TransientAdapterError, UnknownNode


def retry_after(exc: Any, default: float | None) -> float | None:
    headers = getattr(exc, "headers", None) or {}
    try:
        value = headers.get("Retry-After")
        return float(value) if value is not None else default
    except (TypeError, ValueError):
        return default


def map_api_error(exc: BaseException, what: str, node: str | None = None,
                  default_retry_s: float | None = None) -> AdapterError:
    """The adapter error for a failed API call (*what* says which, for the message).

    *node* set: a 404 means that node does not exist (:class:`UnknownNode`).
    """
    status = getattr(exc, "status", None)
    if not isinstance(status, int) or status == 0:  # no HTTP answer: connection refused, timeout
        return TransientAdapterError(f"{what}: API server unreachable ({type(exc).__name__}: {exc}); "
                                     "retry later", retry_after_s=default_retry_s)
    detail = f"HTTP {status} {getattr(exc, 'reason', '') or ''}".strip()
    body = getattr(exc, "body", None)
    if body:
        try:
            detail += f": {json.loads(body).get('message', '')}"
        except (ValueError, AttributeError, TypeError):
            detail += f": {str(body)[:200]}"
    if status == 404 and node is not None:
        return UnknownNode(f"{what}: the API server has no node {node!r} ({detail})")
    if status in (409, 429) or status >= 500:
        return TransientAdapterError(f"{what}: {detail}; retry later",
                                     retry_after_s=retry_after(exc, default_retry_s))
    if status in (401, 403):
        return PermanentAdapterError(f"{what}: {detail}; grant the gpuops service account "
                                     "get/patch on nodes and nodes/status, list pods, create pods/eviction")
    return PermanentAdapterError(f"{what}: {detail}")


def transient_exceptions() -> tuple[type[BaseException], ...]:
    import urllib3.exceptions

    return (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError)
