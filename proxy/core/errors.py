"""The error tree. Each error knows its HTTP status and OpenAI error ``type``.

    SmartCacheError
    ├── ClientError                 4xx: the caller sent something we cannot take
    │   ├── InvalidRequest          400 invalid_request_error
    │   ├── BodyTooLarge            413 invalid_request_error
    │   ├── Unauthorized            401 authentication_error
    │   ├── NotFound                404 not_found_error
    │   └── MethodNotAllowed        405 invalid_request_error
    ├── UpstreamError               the endpoint behind us failed
    │   ├── UpstreamUnavailable     502 (connection refused, reset, DNS)
    │   ├── UpstreamTimeout         504
    │   └── UpstreamStatus          the upstream's own 4xx/5xx, passed through as it came
    ├── ConfigError                 what the proxy or a tool starts from cannot be used
    │   ├── SettingsError           settings.py (a ValueError); PortUnavailable, DataDirInUse
    │   ├── PolicyError             policy.py (a ValueError): a policy file
    │   ├── BadValue                policy_values.py: one policy value, before it learns its key
    │   ├── PackError               embedding/errors.py: an embedding pack
    │   ├── StoreMismatch           storage/base.py (a ValueError): data written by another model
    │   ├── TraceError              tools/datasets/traces.py (a ValueError): a trace line
    │   └── VerifierError           verify/cross_encoder.py: the pair verifier's files
    └── ServiceError                a part of the proxy cannot answer now
        ├── StoreUnavailable        storage/base.py (a RuntimeError)
        ├── Overloaded              microbatch.py: a model's queue is full or too late
        └── EngineError             upstream/engine.py (a RuntimeError): the local engine

Each class beside the part that raises it keeps the builtin base its callers catch it by.

One middleware turns client and upstream errors into ``{"error": {"message", "type", "param",
"code"}}``, with the error's ``headers`` (an upstream's ``retry-after``, ``x-ratelimit-*``,
``x-request-id``; a 405's ``allow``) on the response. A config or service error that reaches it
is the proxy's own failure: logged, and answered as a 500 that tells the client no detail.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class SmartCacheError(Exception):
    status: int = 500
    error_type: str = "server_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers: dict[str, str] = dict(headers or {})  # sent with the error's response

    def to_body(self) -> dict[str, Any]:
        return error_body(self.message, self.error_type, param=self.param, code=self.code)


class ClientError(SmartCacheError):
    status = 400
    error_type = "invalid_request_error"


class InvalidRequest(ClientError):
    pass


class BodyTooLarge(ClientError):
    status = 413


class Unauthorized(ClientError):
    status = 401
    error_type = "authentication_error"


class NotFound(ClientError):
    status = 404
    error_type = "not_found_error"


class MethodNotAllowed(ClientError):
    """A route the proxy serves, asked with a method it does not take; ``allow``: those it does."""

    status = 405

    def __init__(
        self, method: str, path: str, *, allow: str | None, detail: str = "", headers: Mapping[str, str] | None = None
    ) -> None:
        sent = {**(headers or {}), **({"allow": allow} if allow else {})}
        super().__init__(f"Invalid method for URL ({method} {path}){detail}", headers=sent)


class UpstreamError(SmartCacheError):
    status = 502
    error_type = "upstream_error"


class UpstreamUnavailable(UpstreamError):
    status = 502


class UpstreamTimeout(UpstreamError):
    status = 504
    error_type = "timeout"


class UpstreamStatus(UpstreamError):
    """A non-2xx answer from upstream; its status reaches the client unchanged, and its body too
    when it is an OpenAI-style error (``client_body`` wraps anything else)."""

    def __init__(
        self, status: int, body: bytes, content_type: str | None, *, headers: Mapping[str, str] | None = None
    ) -> None:
        """``headers``: the upstream's own end-to-end headers the client keeps (``retry-after``,
        ``x-ratelimit-*``, ``x-request-id``): SDKs back off by them, support tickets quote them."""
        super().__init__(f"upstream answered {status}", code=str(status), headers=headers)
        self.status = status
        self.body = body
        self.content_type = content_type or "application/json"

    def is_openai_error(self) -> bool:
        try:
            parsed = json.loads(self.body)
        except ValueError:
            return False
        return isinstance(parsed, dict) and isinstance(parsed.get("error"), dict)

    def client_body(self) -> dict[str, Any] | None:
        """None: pass the upstream's own body. Otherwise the OpenAI-style error the client gets
        instead: SDKs parse only that shape, and a plain-text 404 usually means the upstream URL
        misses the API path."""
        if self.is_openai_error():
            return None
        snippet = self.body[:200].decode("utf-8", "replace").strip()
        hint = " (is the proxy's upstream URL the API base, usually ending in /v1?)" if self.status == 404 else ""
        message = f"upstream answered {self.status} without an OpenAI-style error{hint}: {snippet!r}"
        return error_body(message, _UPSTREAM_TYPES.get(self.status, "upstream_error"), code=f"upstream_{self.status}")


class ConfigError(SmartCacheError):
    """Settings, a policy, a pack, a data directory or a trace that cannot be used: found at load,
    never mid-request; the message names where it is and how to fix it."""


class ServiceError(SmartCacheError):
    """A part of the proxy (the store, a model, the local engine) cannot answer now."""


# the OpenAI error type a client expects for an upstream status we have to describe ourselves
_UPSTREAM_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


def error_body(message: str, error_type: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}
