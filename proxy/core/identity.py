"""Who is asking: tenant (a hash of the API key) and session.

The API key itself never leaves this module: only its salted hash is kept, stored or logged.
Isolation fails closed: a request without any credential is the anonymous tenant, which no
keyed tenant shares records with; a credential of another scheme (Basic, Token, ...) is a
tenant of its own, never the Bearer tenant of the same secret and never shared with other
unrecognised credentials. A credential in the query string (``?api-key=``, ``?key=``: the query
goes upstream with the request, and some gateways authenticate by it) makes a tenant of its own
with the Authorization header, so two keys sent that way never share answers; keys in bodies are
ignored. A key in another credential header (``api-key``, ``x-api-key``) does the same; two
Authorization headers are refused: the cache must not key on one while upstream
sees another.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from proxy.core.errors import InvalidRequest
from proxy.core.openai.request import ChatRequest

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
    """``t-``: a Bearer key (the scheme is case-insensitive, the key is not); ``x-``: any other
    credential, hashed with its scheme so it can never alias a Bearer tenant; else anonymous."""
    credential = (authorization or "").strip()
    if not credential:
        return ANONYMOUS
    scheme, _, key = credential.partition(" ")
    key = key.strip()
    if scheme.lower() == "bearer":
        if not key:
            return ANONYMOUS
        return "t-" + hashlib.sha256(f"{salt}\x1f{key}".encode()).hexdigest()[:24]
    material = f"{salt}\x1f{scheme.lower()}\x1f{key}" if key else f"{salt}\x1f-\x1f{credential}"
    return "x-" + hashlib.sha256(material.encode()).hexdigest()[:24]


# query parameters that carry a credential (names compared lower-case with "-" as "_")
QUERY_CREDENTIALS = frozenset(
    {"api_key", "apikey", "key", "token", "access_token", "auth", "secret", "password", "sig", "signature", "code"}
)


def query_tenant(authorization: str | None, query: Sequence[tuple[str, str]], *, salt: str) -> str | None:
    """``q-``: a tenant of the query string's credentials together with the Authorization header,
    when the query carries any; None when it carries none."""
    found = sorted(
        (k.lower().replace("-", "_"), v) for k, v in query if k.lower().replace("-", "_") in QUERY_CREDENTIALS
    )
    if not found:
        return None
    material = "\x1f".join([salt, (authorization or "").strip(), *(f"{k}={v}" for k, v in found)])
    return "q-" + hashlib.sha256(material.encode()).hexdigest()[:24]


# headers other than Authorization that carry a credential (Azure OpenAI's ``api-key``, gateways'
# ``x-api-key``): the upstream authenticates by them, so the cache must key on them too
HEADER_CREDENTIALS = ("api-key", "x-api-key", "x-goog-api-key", "ocp-apim-subscription-key")


def header_tenant(authorization: str | None, headers: Mapping[str, str], *, salt: str) -> str | None:
    """``h-``: a tenant of the credential headers (``HEADER_CREDENTIALS``) together with the
    Authorization header, when any is sent; None when none is."""
    found = [(name, headers[name].strip()) for name in HEADER_CREDENTIALS if (headers.get(name) or "").strip()]
    if not found:
        return None
    material = "\x1f".join([salt, (authorization or "").strip(), *(f"{k}={v}" for k, v in found)])
    return "h-" + hashlib.sha256(material.encode()).hexdigest()[:24]


def _one_authorization(headers: Mapping[str, str]) -> str | None:
    # aiohttp's headers keep every value of a repeated header; a plain Mapping cannot repeat one
    getall = getattr(headers, "getall", None)
    if getall is not None and len(getall("Authorization", [])) > 1:
        raise InvalidRequest("send one Authorization header, not several", param="Authorization")
    return headers.get("Authorization")


def clean_header_id(value: str | None, name: str) -> str | None:
    """Session and user ids are opaque ASCII tokens. Confusable or control characters are refused
    rather than normalised, so two different spellings can never alias one session."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    if not _SESSION_OK.fullmatch(value) or unicodedata.normalize("NFKC", value) != value:
        raise InvalidRequest(f"header {name} must be 1-200 characters of A-Z a-z 0-9 . _ : @ / + = -", param=name)
    return value


def opening(text: str) -> str:
    """A conversation's first user turn as the derived session reads it: width, case, spacing and
    trailing punctuation folded, so "What is X?" and "what is x" open one conversation thread."""
    folded = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    return folded.rstrip("?!.。？！ ")


def derived_session(tenant: str, request: ChatRequest, *, user: str | None = None) -> str:
    """Without a session header, a conversation is known by what stays fixed as it grows: the
    tenant, the end user's id (``user``: the user header or else body `user`, which keeps two
    people who open with the same words apart), the model, the system prompt and the opening user
    turn. Two conversations that open alike therefore share a session; that is safe because the
    same opening asked again there is not taken for a regenerate (proxy/service/feedback.py) and their
    answers are keyed by the whole conversation anyway. Reuse across conversations that open
    differently comes from the policy's scopes, never from the session id."""
    first_user = next((m.text for m in request.messages if m.role == "user"), "")
    who = user if user is not None else request.user or ""
    material = "\x1f".join((tenant, who, request.model, request.system_text, opening(first_user)))
    return "d-" + hashlib.sha256(material.encode()).hexdigest()[:24]


def caller_tenant(headers: Mapping[str, str], *, salt: str, query: Sequence[tuple[str, str]] = ()) -> str:
    """The tenant of every credential the caller sends: the Authorization header, the other
    credential headers, and the query string (which goes upstream with a chat request)."""
    authorization = _one_authorization(headers)
    with_header = header_tenant(authorization, headers, salt=salt)
    return (
        query_tenant(with_header or authorization, query, salt=salt)
        or with_header
        or tenant_of(authorization, salt=salt)
    )


def identify(
    headers: Mapping[str, str], request: ChatRequest, *, salt: str, query: Sequence[tuple[str, str]] = ()
) -> Identity:
    """``query``: the request's query string as pairs, which goes upstream with it."""
    tenant = caller_tenant(headers, salt=salt, query=query)
    explicit = clean_header_id(headers.get(SESSION_HEADER), SESSION_HEADER)
    user = clean_header_id(headers.get(USER_HEADER), USER_HEADER) or request.user
    session = explicit or derived_session(tenant, request, user=user)
    return Identity(tenant=tenant, session=session, user=user, session_explicit=explicit is not None)
