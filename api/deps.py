"""The routes' dependencies: the :class:`~api.context.AppContext` and the authenticated caller.

``Viewer``, ``Operator`` and ``Admin`` are ``Annotated`` parameters: a route that takes one
answers 401 (with ``WWW-Authenticate: Bearer``) without a valid token and 403 when the
token's role is too low, before its body runs.
"""

from __future__ import annotations

from typing import Annotated, Awaitable, Callable

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.auth import Principal, Role
from api.context import AppContext
from api.errors import ApiError

_bearer = HTTPBearer(auto_error=False, description="A token from the service config (tokens:) or the one "
                     "`gpuops serve` prints at start-up.")


async def get_ctx(request: Request) -> AppContext:
    # async: CPU only, so FastAPI runs it inline instead of in its thread pool
    return request.app.state.ctx


Ctx = Annotated[AppContext, Depends(get_ctx)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def caller(need: Role) -> Callable[..., Awaitable[Principal]]:
    """A dependency: the caller, who must hold at least role *need*."""

    async def _caller(ctx: Ctx, cred: Credentials) -> Principal:   # CPU only (a hash): inline, no thread hop
        who = ctx.auth.authenticate(cred.credentials if cred is not None else None)
        if who is None:
            raise ApiError(401, "a valid bearer token is required (Authorization: Bearer <token>)",
                           headers={"WWW-Authenticate": "Bearer"})
        if who.role < need:
            raise ApiError(403, f"token {who.name!r} has role {who.role.name.lower()}; this needs "
                           f"{need.name.lower()} or higher")
        return who

    _caller.__name__ = f"need_{need.name.lower()}"
    return _caller


Viewer = Annotated[Principal, Depends(caller(Role.VIEWER))]
Operator = Annotated[Principal, Depends(caller(Role.OPERATOR))]
Admin = Annotated[Principal, Depends(caller(Role.ADMIN))]
