"""The one error vocabulary: codes, their HTTP status and OpenAI error type."""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    INVALID_VALUE = "invalid_value"
    INVALID_JSON = "invalid_json"
    MISSING_REQUIRED_PARAMETER = "missing_required_parameter"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    UNSUPPORTED_PARAMETER = "unsupported_parameter"
    MODEL_NOT_FOUND = "model_not_found"
    KV_HANDLE_NOT_FOUND = "kv_handle_not_found"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    REQUEST_TOO_LARGE = "request_too_large"
    REQUEST_TIMEOUT = "request_timeout"
    INVALID_API_KEY = "invalid_api_key"
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
    NO_CAPACITY = "no_capacity"
    SHUTTING_DOWN = "shutting_down"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    INTERNAL_ERROR = "internal_error"


# code -> (HTTP status, OpenAI error type)
_STATUS: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.INVALID_VALUE: (400, "invalid_request_error"),
    ErrorCode.INVALID_JSON: (400, "invalid_request_error"),
    ErrorCode.MISSING_REQUIRED_PARAMETER: (400, "invalid_request_error"),
    ErrorCode.CONTEXT_LENGTH_EXCEEDED: (400, "invalid_request_error"),
    ErrorCode.UNSUPPORTED_PARAMETER: (422, "invalid_request_error"),
    ErrorCode.MODEL_NOT_FOUND: (404, "invalid_request_error"),
    ErrorCode.KV_HANDLE_NOT_FOUND: (404, "invalid_request_error"),
    ErrorCode.NOT_FOUND: (404, "invalid_request_error"),
    ErrorCode.METHOD_NOT_ALLOWED: (405, "invalid_request_error"),
    ErrorCode.REQUEST_TOO_LARGE: (413, "invalid_request_error"),
    ErrorCode.REQUEST_TIMEOUT: (408, "invalid_request_error"),
    ErrorCode.INVALID_API_KEY: (401, "invalid_request_error"),
    ErrorCode.RATE_LIMIT_EXCEEDED: (429, "rate_limit_error"),
    ErrorCode.NO_CAPACITY: (503, "service_unavailable_error"),
    ErrorCode.SHUTTING_DOWN: (503, "service_unavailable_error"),
    ErrorCode.ENGINE_UNAVAILABLE: (503, "service_unavailable_error"),
    ErrorCode.INTERNAL_ERROR: (500, "internal_error"),
}


class ServingError(Exception):
    """A request failed for a reason the client should see, in the OpenAI shape."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        param: str | None = None,
        *,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.retry_after = retry_after  # seconds: the Retry-After of a 429 or 503

    @property
    def http_status(self) -> int:
        return _STATUS[self.code][0]

    @property
    def error_type(self) -> str:
        return _STATUS[self.code][1]

    def to_document(self, request_id: str | None = None) -> dict[str, dict[str, str | None]]:
        """The OpenAI error body; the message names the request, when given."""
        message = self.message if request_id is None else f"{self.message} (request {request_id})"
        return {
            "error": {
                "message": message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code.value,
            }
        }
