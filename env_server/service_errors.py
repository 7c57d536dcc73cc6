"""Refusals of a request (not of a tool call): one exception type, one HTTP status per code."""

from __future__ import annotations

from typing import Any

from env_server.models import ApiError, ApiErrorCode

HTTP_STATUS: dict[ApiErrorCode, int] = {
    ApiErrorCode.INVALID_JSON: 400,
    ApiErrorCode.INVALID_REQUEST: 422,
    ApiErrorCode.UNAUTHORIZED: 401,
    ApiErrorCode.FORBIDDEN: 403,
    ApiErrorCode.NOT_FOUND: 404,
    ApiErrorCode.METHOD_NOT_ALLOWED: 405,
    ApiErrorCode.BODY_TOO_LARGE: 413,
    ApiErrorCode.SESSION_NOT_FOUND: 404,
    ApiErrorCode.TASK_NOT_FOUND: 404,
    ApiErrorCode.NO_REFERENCE: 404,
    ApiErrorCode.EPISODE_NOT_STARTED: 409,
    ApiErrorCode.EPISODE_DONE: 409,
    ApiErrorCode.CAPACITY_REACHED: 503,
    ApiErrorCode.SANDBOX_UNAVAILABLE: 503,
    ApiErrorCode.INTERNAL_ERROR: 500,
    ApiErrorCode.SESSION_LOST: 502,
    ApiErrorCode.REPLICA_UNAVAILABLE: 502,
}


class ServiceError(Exception):
    """A request the service refuses; rendered as an `ApiError` body (HTTP) or error frame (WS)."""

    def __init__(self, code: ApiErrorCode, message: str, detail: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.detail = detail

    @property
    def status(self) -> int:
        return HTTP_STATUS[self.code]

    def body(self) -> ApiError:
        return ApiError(code=self.code, message=self.message, detail=self.detail)
