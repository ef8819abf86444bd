"""Who is asking: tenant (a hash of the API key) and session.

The API key itself never leaves this module: only its salted hash is kept, stored or logged.
Isolation fails closed: a request without a recognisable bearer key is the anonymous tenant,
which no keyed tenant shares records with. Keys in query strings are ignored on purpose.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass

from proxy.errors import InvalidRequest
from proxy.openai_body import ChatRequest

ANONYMOUS = "anonymous"
SESSION_HEADER = "x-smartcache-session"
USER_HEADER = "x-smartcache-user"
_SESSION_OK = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,200}$")


@dataclass(frozen=True, slots=True)
class Identity:
    tenant: str
    session: str
    user: str | None
    session_explicit: bool


def tenant_of(authorization: str | None, *, salt: str) -> str:
    if not authorization:
        return ANONYMOUS
    scheme, _, key = authorization.strip().partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        return ANONYMOUS
    return "t-" + hashlib.sha256(f"{salt}\x1f{key}".encode()).hexdigest()[:24]


def clean_header_id(value: str | None, name: str) -> str | None:
    """Session and user ids are opaque ASCII tokens. Confusable or control characters are refused
    rather than normalised, so two different spellings can never alias one session."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    if not _SESSION_OK.fullmatch(value) or unicodedata.normalize("NFKC", value) != value:
        raise InvalidRequest(
            f"header {name} must be 1-200 characters of A-Z a-z 0-9 . _ : @ / + = -", param=name
        )
    return value


def derived_session(tenant: str, request: ChatRequest) -> str:
    first_user = next((m.text for m in request.messages if m.role == "user"), "")
    # the end user's id (body `user`) keeps two people who open with the same words apart
    material = "\x1f".join((tenant, request.user or "", request.model, request.system_text, first_user))
    return "d-" + hashlib.sha256(material.encode()).hexdigest()[:24]


def identify(headers: Mapping[str, str], request: ChatRequest, *, salt: str) -> Identity:
    tenant = tenant_of(headers.get("Authorization"), salt=salt)
    explicit = clean_header_id(headers.get(SESSION_HEADER), SESSION_HEADER)
    user = clean_header_id(headers.get(USER_HEADER), USER_HEADER) or request.user
    session = explicit or derived_session(tenant, request)
    return Identity(tenant=tenant, session=session, user=user, session_explicit=explicit is not None)
