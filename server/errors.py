"""OpenAI-style error responses: ``{"error": {"message", "type", "param", "code"}}`` with a 4xx/5xx status.

Every failure the gateway answers goes through :func:`error_response`, so clients (the official
``openai`` package included) raise their usual typed exceptions with a readable message.
"""

from __future__ import annotations

import json

from starlette.responses import Response

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "service_unavailable_error",
    503: "service_unavailable_error",
    504: "service_unavailable_error",
}
"""OpenAI's error ``type`` for each status the gateway answers (OpenAI answers an unknown model, too,
with ``invalid_request_error`` and code ``model_not_found``)."""
OPENAI_ERROR_TYPES = frozenset(ERROR_TYPES.values()) | {
    "not_found_error",
    "conflict_error",
    "insufficient_quota",
}


def openai_error_type(status: int, upstream_type: object = None) -> str:
    """The ``type`` a client of the gateway sees for an error with this status.

    A backend's type already in OpenAI's vocabulary is kept; vLLM's own names (``BadRequestError``,
    ``NotFoundError``, HTTP phrases such as ``Bad Request``) are replaced by OpenAI's for the status.
    """
    if isinstance(upstream_type, str) and upstream_type in OPENAI_ERROR_TYPES:
        return upstream_type
    return ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


class GatewayError(Exception):
    """An error the gateway answers itself (bad input, unknown model, backend down ...)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def response(self) -> Response:
        """This error as an HTTP response."""
        return error_response(
            self.status, self.message, param=self.param, code=self.code, headers=self.headers
        )


def error_body(status: int, message: str, *, param: str | None = None, code: str | int | None = None) -> dict:
    """The JSON body of an OpenAI error."""
    return {
        "error": {
            "message": message,
            "type": openai_error_type(status),
            "param": param,
            "code": code,
        }
    }


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | int | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """An OpenAI error as a JSON response."""
    return Response(
        json.dumps(error_body(status, message, param=param, code=code)),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def validation_problems(error) -> str:
    """A pydantic ``ValidationError`` as one line: ``field.path: message; ...``."""
    return "; ".join(
        f"{'.'.join(str(part) for part in problem['loc']) or 'body'}: {problem['msg']}"
        for problem in error.errors()
    )
