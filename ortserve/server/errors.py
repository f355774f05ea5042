"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Everything a client can get wrong maps to a 4xx whose message names the field; only our own
bugs and a dead engine answer 5xx. No traceback, file path or exception class reaches a client:
an unexpected error answers "internal error" with an id, and the details go to the log with it.
"""

from __future__ import annotations

import logging
import re
import uuid
from http import HTTPStatus
from typing import Any

from litestar import Request, Response
from litestar.exceptions import (
    HTTPException,
    SerializationException,
    ValidationException,
)

from .responses import ErrorInfo, ErrorResponse

logger = logging.getLogger("ortserve.server")
CLIENT_LEFT_MID_BODY = "client disconnected prematurely"  # Litestar's InternalServerException detail


class APIError(Exception):
    """An error answered to the client as-is."""

    status_code = 400
    type = "invalid_request_error"
    code: str | None = None

    def __init__(
        self, message: str, param: str | None = None, *, code: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code or self.code
        self.headers = headers

    def to_response(self) -> Response[ErrorResponse]:
        return error_response(self.status_code, self.message, self.type, self.param, self.code, self.headers)


class BadRequest(APIError):
    status_code = 400


class Unauthorized(APIError):
    status_code = 401
    code = "invalid_api_key"


class ModelNotFound(APIError):
    status_code = 404
    code = "model_not_found"


class Overloaded(APIError):
    status_code = 429
    type = "rate_limit_error"
    code = "server_overloaded"


class EngineUnavailable(APIError):
    status_code = 503
    type = "service_unavailable"
    code = "engine_unavailable"


class EngineFailure(APIError):
    status_code = 500
    type = "internal_server_error"
    code = "engine_error"


def error_response(
    status: int,
    message: str,
    type_: str | None = None,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response[ErrorResponse]:
    if type_ is None:
        type_ = "invalid_request_error" if status < 500 else "internal_server_error"
    body = ErrorResponse(
        error=ErrorInfo(message=message, type=type_, param=param, code=code if code is not None else str(status))
    )
    return Response(body, status_code=status, headers=headers)


# Segments of a pydantic error location that name a branch of a union, not a field or an index:
# "constrained-str", "list[TextPart]", "TextPart", "str", "function-after[...]".
_PLAIN_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


# Fields whose union is discriminated by "type" (response_format, the Responses API's text.format):
# pydantic puts the branch's tag, the type's value ("json_schema"), after them.
_DISCRIMINATED = frozenset({"response_format", "format"})


def _is_union_tag(segments: list[str], i: int) -> bool:
    segment = segments[i]
    if i > 0 and segments[i - 1] in _DISCRIMINATED:
        return True
    return "[" in segment or "-" in segment or segment[:1].isupper() or segment in _PLAIN_TYPE_TAGS


def _branches_that_fit(errors: list[tuple[list[str], str]]) -> list[tuple[list[str], str]]:
    """Of a union's branches, only those that fit the value best: a branch that took the value's type
    (its errors are more than "Input should be a valid ...") over one that did not, then the branch
    whose errors reach deepest. So a list of content parts gets the list branch's error about part 1,
    not the string branch's "Input should be a valid string"; branches that fit as well are all
    kept ("a valid string or a valid list")."""
    fit: dict[tuple[str, ...], dict[str, tuple[bool, int]]] = {}  # fork (path before a tag) -> tag -> fit
    for segments, message in errors:
        took_type = not message.startswith("Input should be a valid ")
        for i, segment in enumerate(segments):
            if _is_union_tag(segments, i):
                tags = fit.setdefault(tuple(segments[:i]), {})
                took, depth = tags.get(segment, (False, 0))
                tags[segment] = (took or took_type, max(depth, len(segments)))
    best = {fork: {t for t, f in tags.items() if f == max(tags.values())} for fork, tags in fit.items()}
    return [
        (segments, message)
        for segments, message in errors
        if all(segment in best[tuple(segments[:i])] for i, segment in enumerate(segments) if _is_union_tag(segments, i))
    ]


def _key_segments(key: str) -> list[str]:
    """Litestar's "."-joined error location, split again; dots inside a union tag's brackets stay."""
    segments, depth, start = [], 0, 0
    for i, char in enumerate(key):
        depth += (char == "[") - (char == "]")
        if char == "." and depth == 0:
            segments.append(key[start:i])
            start = i + 1
    return [*segments, key[start:]] if key else []


def _field_path(segments: list[str]) -> str:
    """["messages", "0", "content", "list[TextPart]", "1"] -> "messages[0].content[1]"."""
    path = ""
    for i, segment in enumerate(segments):
        if segment.isdigit():
            path += f"[{segment}]"
        elif not _is_union_tag(segments, i):
            path += f".{segment}" if path else segment
    return path


def _validation_message(exc: ValidationException) -> tuple[str, str | None]:
    """One readable sentence from Litestar's list of pydantic errors, each named by its path in the
    body (``messages[0].content[1]``), and the top-level field as the param."""
    errors: list[tuple[list[str], str]] = []
    for item in exc.extra if isinstance(exc.extra, list) else []:
        key = str(item.get("key") or "") if isinstance(item, dict) else ""
        message = str(item.get("message", item)) if isinstance(item, dict) else str(item)
        if key == "data" or (not key and "valid dictionary" in message):
            return "The request body must be a JSON object", None
        errors.append((_key_segments(key), message.removeprefix("Value error, ")))
    problems: dict[str, list[str]] = {}
    for segments, message in _branches_that_fit(errors):
        messages = problems.setdefault(_field_path(segments), [])
        if message not in messages:
            messages.append(message)
    if not problems:
        return exc.detail, None
    parts = [f"'{f}': {' or '.join(m)}" if f else "; ".join(m) for f, m in problems.items()]
    first = next(iter(problems)).split(".")[0].split("[")[0] or None
    return "Invalid request: " + "; ".join(parts), first


def handle_api_error(_: Request, exc: APIError) -> Response[ErrorResponse]:
    return exc.to_response()


def handle_http_exception(request: Request, exc: HTTPException) -> Response[ErrorResponse]:
    status = exc.status_code
    if status in (404, 405) and exc.detail == HTTPStatus(status).phrase:  # the router's, not a handler's
        code = "not_found" if status == 404 else "method_not_allowed"
        return error_response(status, _no_such_route(request, status), code=code)
    if isinstance(exc, ValidationException):
        message, param = _validation_message(exc)
        return error_response(400, message, param=param)
    if status == 413:
        return error_response(
            413,
            "Request body too large; the limit is set by --max-request-body-bytes",
            param=None,
            code="request_too_large",
        )
    if exc.detail == CLIENT_LEFT_MID_BODY:  # nobody reads the answer; not a server error either
        logger.info("a client disconnected before its request body arrived")
        return error_response(400, "the client disconnected before the request body arrived")
    if status >= 500:
        return error_response(status, internal_error_message(exc))
    detail = exc.detail or HTTPStatus(status).phrase
    if isinstance(exc.__cause__, SerializationException):
        detail = f"Malformed JSON body: {detail}"
    return error_response(status, detail, headers=exc.headers)


def _no_such_route(request: Request, status: int) -> str:
    """What the client asked for and what this server has instead."""
    asked = f"{request.method} {request.url.path}"
    routes = {
        re.sub(r":\w+}", "}", path): sorted(methods - {"HEAD", "OPTIONS"})
        for path, methods in ((route.path, set(getattr(route, "methods", ()))) for route in request.app.routes)
        if path.startswith("/v1/") or path in ("/tokenize", "/detokenize", "/health", "/metrics", "/version")
    }
    if status == 405 and request.url.path in routes:
        return f"{asked} is not allowed: {request.url.path} takes {' or '.join(routes[request.url.path])}"
    if request.url.path.startswith("/v1/responses/"):
        return f"there is no {asked}: this server stores no responses (store is always false)"
    offered = ", ".join(f"{' '.join(methods)} {path}" for path, methods in sorted(routes.items()))
    return f"there is no {asked} on this server; it serves {offered}"


def internal_error_message(exc: BaseException, request_id: str | None = None) -> str:
    """Log ``exc`` with an id and return the client's message, which names only the id."""
    error_id = request_id or f"err-{uuid.uuid4().hex[:12]}"
    logger.error("internal error %s", error_id, exc_info=exc)
    return f"internal error (id {error_id}); the server log has the details"


def handle_internal_error(request: Request, exc: Exception) -> Response[ErrorResponse]:
    if isinstance(exc, RecursionError):  # a body nested deeper than the parser goes
        return error_response(400, "The JSON body is nested too deeply", code="body_too_deep")
    if isinstance(exc, UnicodeDecodeError):
        return error_response(400, "The request body is not valid UTF-8 JSON", code="invalid_encoding")
    return error_response(500, internal_error_message(exc))


EXCEPTION_HANDLERS: dict[type[Exception], Any] = {
    APIError: handle_api_error,
    HTTPException: handle_http_exception,
    Exception: handle_internal_error,
}


def error_event(exc: Exception, request_id: str | None = None) -> str:
    """An error after a stream's status line went out: an ``{"error": ...}`` SSE event, which
    OpenAI's SDKs raise as APIError."""
    if isinstance(exc, APIError):
        info = ErrorInfo(message=exc.message, type=exc.type, param=exc.param, code=exc.code)
    else:
        info = ErrorInfo(message=internal_error_message(exc, request_id), type="internal_server_error", code="500")
    return ErrorResponse(error=info).model_dump_json()
