"""What the live servers need to know of the OpenAI-compatible API: errors, request checks, call identity.

The proxy and the engine server answer a bad request the way vLLM does (400, an OpenAI error
object naming the bad field) from the same checks here. The proxy never rewrites a request: it
reads just enough of it to validate it, to estimate its prompt size for the deadline check, and to
build the coalescing key (tenant, call id and a hash of the whole body, so that a retry that
differs in anything never attaches).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from aiohttp import web

__all__ = ["MAX_CALL_ID_CHARS", "BadRequest", "ParsedRequest", "bool_field", "call_digest", "call_identity",
           "coalescing_key", "error_body", "error_response", "is_positive_int", "is_token_ids", "json_object",
           "parse_request"]

ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 405: "MethodNotAllowedError",
               413: "RequestEntityTooLargeError", 429: "RateLimitError", 502: "BadGatewayError",
               503: "ServiceUnavailableError", 504: "GatewayTimeoutError"}
DEFAULT_MAX_TOKENS = 16  # vLLM's default for /v1/completions


class BadRequest(ValueError):
    """The request cannot be served; answered 400 with `param` naming the bad field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    prompt_tokens: int  # exact for token-id prompts, estimated (words) for text
    max_tokens: int
    stream: bool


def error_body(status: int, message: str, param: str | None = None) -> bytes:
    """An OpenAI-style error object, as vLLM sends it."""
    error = {"message": message, "type": ERROR_TYPES.get(status, "APIError"), "param": param, "code": status}
    return json.dumps({"error": error}).encode()


def error_response(status: int, message: str, param: str | None = None,
                   headers: Mapping[str, str] | None = None) -> web.Response:
    """`error_body` as a JSON response with this status (and any extra headers)."""
    return web.Response(status=status, body=error_body(status, message, param),
                        headers={"Content-Type": "application/json", **(headers or {})})


def json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object; raises BadRequest when it is not one."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BadRequest(f"the body is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    return data


def bool_field(data: Mapping[str, Any], name: str) -> bool:
    """A true/false field, false when absent; raises BadRequest when it is anything else."""
    value = data.get(name, False)
    if not isinstance(value, bool):
        raise BadRequest(f"'{name}' must be true or false", name)
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is no token count


def is_positive_int(value: Any) -> TypeGuard[int]:
    return _is_int(value) and value >= 1


def is_token_ids(value: Any) -> TypeGuard[list[int]]:
    """A list of token ids (integers, not booleans); possibly empty."""
    return isinstance(value, list) and all(_is_int(t) for t in value)


def _text_tokens(text: str) -> int:
    return max(1, len(text.split()))


def _prompt_tokens(prompt: Any) -> int:
    if isinstance(prompt, str):
        return _text_tokens(prompt)
    if isinstance(prompt, list) and prompt:
        if is_token_ids(prompt):
            return len(prompt)
        if all(isinstance(p, str) for p in prompt):
            return sum(_text_tokens(p) for p in prompt)
    raise BadRequest("'prompt' must be a string, a list of strings or a non-empty list of token ids", "prompt")


def _messages_tokens(messages: Any) -> int:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list", "messages")
    total = 0
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest("each message needs a string 'role'", "messages")
        content = message.get("content", "")
        if isinstance(content, str):
            total += _text_tokens(content)
        elif isinstance(content, list):
            total += sum(_text_tokens(str(part.get("text", ""))) for part in content if isinstance(part, dict))
        elif content is not None:
            raise BadRequest("message 'content' must be a string or a list of parts", "messages")
    return total


def parse_request(body: bytes, chat: bool) -> ParsedRequest:
    """Validate a completions (or chat completions) body; raises BadRequest."""
    data = json_object(body)
    prompt_tokens = _messages_tokens(data.get("messages")) if chat else _prompt_tokens(data.get("prompt"))
    max_tokens = data.get("max_completion_tokens" if chat and "max_completion_tokens" in data else "max_tokens",
                          DEFAULT_MAX_TOKENS)
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if not is_positive_int(max_tokens):
        raise BadRequest("'max_tokens' must be a positive integer", "max_tokens")
    return ParsedRequest(prompt_tokens, max_tokens, bool_field(data, "stream"))


MAX_CALL_ID_CHARS = 255  # an Idempotency-Key's longest (as common APIs allow)


def call_digest(call_id: str) -> str:
    """A call id as the proxy keeps, compares and logs it: a digest, never the caller's key in clear
    (a key may carry what its caller would not have logged)."""
    return hashlib.sha256(call_id.encode()).hexdigest()[:32]


def call_identity(headers: Mapping[str, str]) -> tuple[str, str | None]:
    """(tenant, call id): the tenant is a digest of the Authorization header, the call id one of the
    caller's Idempotency-Key (or X-Call-Id), neither kept in clear; None when the caller sent no key.
    Raises BadRequest for a key over MAX_CALL_ID_CHARS."""
    auth = headers.get("Authorization", "")
    tenant = hashlib.sha256(auth.encode()).hexdigest()[:16] if auth else "-"
    name = "Idempotency-Key" if headers.get("Idempotency-Key") else "X-Call-Id"
    call_id = headers.get(name) or None
    if call_id is not None and len(call_id) > MAX_CALL_ID_CHARS:
        raise BadRequest(f"the {name} header is {len(call_id)} characters, over the limit of {MAX_CALL_ID_CHARS}",
                         name)
    return tenant, None if call_id is None else call_digest(call_id)


def coalescing_key(tenant: str, call_id: str, path: str, body: bytes) -> str:
    digest = hashlib.sha256(body).hexdigest()
    return f"{tenant}|{call_id}|{path}|{digest}"
