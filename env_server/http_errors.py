"""How a refused request reads over HTTP: the handlers that render every refusal as an `ApiError`
body, and the OpenAPI `responses` each route declares (docs/decisions/026-typed-500-and-the-schema-as-contract.md).

An unhandled error's typed 500 is answered by `env_server.middleware.RequestGuard`, not here.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from env_server.admission import ClientGone
from env_server.models import ApiError, ApiErrorCode
from env_server.service_errors import ServiceError

ERROR_MEANINGS: dict[int, str] = {
    400: "`invalid_json`: the body is not JSON.",
    401: "`unauthorized`: a token is configured and the request lacks it.",
    403: "`forbidden`: a privileged route without the service's privileged token (or the service has none).",
    404: "`session_not_found` / `task_not_found` / `no_reference` / `not_found`.",
    409: "`episode_not_started` (no episode yet where none is started for you) or `episode_done` (reset to play again).",
    413: "`body_too_large`: the body exceeds `max_body_bytes`.",
    422: "`invalid_request`: the body does not match the schema (an inline task spec included).",
    500: "`internal_error`: a bug; the connection stays usable.",
    503: "`capacity_reached` (session cap, after the admission queue) or `sandbox_unavailable` (no sandbox within the start deadline).",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the refusals a route can answer (every route may also answer 401
    when a token is configured, and 500)."""
    return {status: {"model": ApiError, "description": ERROR_MEANINGS[status]} for status in sorted({*statuses, 401, 500})}


CLIENT_CLOSED_REQUEST = 499
"""Status logged for a request whose client went away while it waited for admission."""

BODY_ERRORS = (400, 413, 422)
"""What any route with a JSON body can be refused with before it runs."""


def error_response(exc: ServiceError) -> JSONResponse:
    """A refusal's answer: its `ApiError` body with its status."""
    return JSONResponse(exc.body().model_dump(mode="json"), status_code=exc.status)


def add_error_handlers(app: FastAPI) -> None:
    """Render every refusal FastAPI or a route raises as an `ApiError` body with its status."""

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone) -> Response:
        # The client left while its new session was queued: nobody reads this answer (499 is the
        # usual log status for "client closed the request"); it only ends the request cleanly.
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = exc.errors()
        if any(e.get("type") == "json_invalid" for e in problems):
            return error_response(ServiceError(ApiErrorCode.INVALID_JSON, "request body is not valid JSON"))
        detail = [{k: e[k] for k in ("type", "loc", "msg") if k in e} for e in problems]
        first = problems[0] if problems else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        message = f"request does not match the schema: {where or 'body'}: {first.get('msg', 'invalid')}"
        if len(problems) > 1:
            message += f" (and {len(problems) - 1} more)"
        return error_response(ServiceError(ApiErrorCode.INVALID_REQUEST, message, detail))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: ApiErrorCode.NOT_FOUND, 405: ApiErrorCode.METHOD_NOT_ALLOWED}.get(exc.status_code, ApiErrorCode.INVALID_REQUEST)
        return JSONResponse(ApiError(code=code, message=str(exc.detail)).model_dump(mode="json"), status_code=exc.status_code)
