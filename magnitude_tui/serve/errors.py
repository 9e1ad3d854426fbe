"""Provides OpenAIError: an error answered in the OpenAI shape, with its HTTP status."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class ErrorType(str, Enum):
    """The `error.type` values OpenAI clients know."""

    INVALID_REQUEST = "invalid_request_error"
    AUTHENTICATION = "authentication_error"
    NOT_FOUND = "not_found_error"
    RATE_LIMIT = "rate_limit_error"
    UNAVAILABLE = "service_unavailable_error"
    SERVER = "server_error"


@dataclass
class OpenAIError(Exception):
    """Answered as `{"error": {"message", "type", "code", "param"}}` with `status`."""

    status: int
    message: str
    type: ErrorType = ErrorType.INVALID_REQUEST
    code: str | None = None
    param: str | None = None
    retry_after_s: int | None = None  # sent as Retry-After (429, 503)

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type.value, "code": self.code,
                          "param": self.param}}

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)} if self.retry_after_s is not None else {}


def invalid(param: str | None, message: str, code: str | None = "invalid_value") -> OpenAIError:
    return OpenAIError(400, message, ErrorType.INVALID_REQUEST, code, param)
