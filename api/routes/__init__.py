"""One router per resource: nodes, actions, silences, engine, models, replays, health."""

from api.schemas import ErrorBody

#: the error answers every route may give, in the OpenAPI (one shape: api/errors.py)
AUTH_ERRORS = {400: {"model": ErrorBody, "description": "The body cannot be parsed (not JSON, not UTF-8)"},
               401: {"model": ErrorBody, "description": "No or unknown token"},
               403: {"model": ErrorBody, "description": "The token's role is too low"},
               422: {"model": ErrorBody, "description": "Invalid input"}}
NOT_FOUND = {404: {"model": ErrorBody, "description": "No such resource"}}
CONFLICT = {409: {"model": ErrorBody, "description": "The record's state does not allow it"}}
UNAVAILABLE = {503: {"model": ErrorBody, "description": "The store or scheduler is unavailable; retry"}}

__all__ = ["AUTH_ERRORS", "NOT_FOUND", "CONFLICT", "UNAVAILABLE"]
