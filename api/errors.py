"""The API's error answers: ``{"error": {"code", "message", "detail"}}`` for every 4xx and 5xx.

Routes raise :class:`ApiError` (or let a domain error through); :func:`install` maps the
domain's errors to statuses — unknown id 404, a move the record's state does not allow 409,
bad input 422, a store or scheduler that is down 503 — so bad input never becomes a 500.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from collector.recording import RecordingError
from models.base import ModelError
from remediation.actions import InvalidTransition
from remediation.adapters.base import PermanentAdapterError, TransientAdapterError
from remediation.store import StaleRecord, StoreError, StoreUnavailable

log = logging.getLogger(__name__)

_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
          409: "conflict", 422: "invalid", 500: "internal", 501: "not_implemented", 503: "unavailable"}


class ApiError(Exception):
    """An answer other than success, with a message saying what is wrong and what to do."""

    def __init__(self, status: int, message: str, detail: Any = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.detail = status, message, detail
        self.code = code or _CODES.get(status, "error")
        self.headers = headers


def body(status: int, message: str, detail: Any = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"code": code or _CODES.get(status, "error"), "message": message, "detail": detail}}


def _answer(status: int, message: str, detail: Any = None, code: str | None = None,
            headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body(status, message, detail, code), default=str), status_code=status,
                    headers=headers, media_type="application/json")


def install(app: FastAPI) -> None:
    """Register the handlers on *app*."""

    @app.exception_handler(ApiError)
    async def _api(_: Request, e: ApiError) -> Response:
        return _answer(e.status, e.message, e.detail, e.code, e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException) -> Response:
        return _answer(e.status_code, str(e.detail), None, None, getattr(e, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError) -> Response:
        errs = [{"loc": list(x.get("loc", ())), "msg": str(x.get("msg", "")), "type": str(x.get("type", ""))}
                for x in e.errors()]
        first = errs[0] if errs else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(p) for p in first["loc"])
        return _answer(422, f"invalid request: {where}: {first['msg']}", errs)

    def handler(status: int, prefix: str = ""):
        async def _h(_: Request, e: Exception) -> Response:
            return _answer(status, prefix + str(e))
        return _h

    app.add_exception_handler(InvalidTransition, handler(409))
    app.add_exception_handler(StaleRecord, handler(409))
    app.add_exception_handler(StoreUnavailable, handler(503, "the action store is unavailable: "))
    app.add_exception_handler(StoreError, handler(422))
    app.add_exception_handler(PermanentAdapterError, handler(422))
    app.add_exception_handler(TransientAdapterError, handler(503, "the scheduler is unavailable, retry later: "))
    app.add_exception_handler(ModelError, handler(422))
    app.add_exception_handler(RecordingError, handler(422))
    # input a route passed on that the domain refused (a more specific handler above wins)
    app.add_exception_handler(ValueError, handler(422))

    @app.exception_handler(Exception)
    async def _bug(request: Request, e: Exception) -> Response:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _answer(500, f"internal error ({type(e).__name__}); the server log has the traceback")
