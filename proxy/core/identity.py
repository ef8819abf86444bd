"""Who is asking: tenant (a hash of the API key's value) and session.

The API key itself never leaves this module: only its salted hash is kept, stored or logged.

A tenant is the key's value, whatever carries it: ``Authorization: Bearer K``, ``api-key: K``,
``x-api-key: K``, ``x-goog-api-key: K``, ``ocp-apim-subscription-key: K`` and a credential in the
query string (``?api-key=K``, ``?key=K``: the query goes upstream with the request, and some
gateways authenticate by it) are one tenant. Whoever sends the same secret holds the same key, so
folding its carriers together gives nobody anything they do not already hold. ``Token K`` and a
bare ``Authorization: K`` are the key ``K`` too: their value is the key itself. Any other scheme
(``Basic``, ``Digest``, an AWS signature, ...) is a credential of its own, hashed with its scheme,
so it never aliases a key even when the strings agree: Basic's value encodes a user and a password,
not a key. Keys in bodies are ignored.

Isolation fails closed. A caller sending several distinct credentials (``Bearer A`` with
``api-key: B``, a query key beside a header key) is the tenant of that *set*: never tenant A
alone nor tenant B alone, since the cache must not serve by one key what upstream may answer by
another. Its id lists each credential's own hash (``t-<a>+<b>``, sorted), so a purge by one key
also finds the tenants that key is part of (proxy/http/admin.py). Two Authorization headers are
refused, and so are more than ``MAX_CREDENTIALS`` distinct credentials. A request without any
credential is the anonymous tenant, which shares nothing (proxy/service/reach.py): no keyed
tenant reads its answers and it reads none of theirs.

Changing how tenant ids are derived changes the ids of records written before: those are then
nobody's, served to no one, and age out.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from proxy.core.errors import InvalidRequest
from proxy.core.openai.request import ChatRequest

ANONYMOUS = "anonymous"
SESSION_HEADER = "x-smartcache-session"
USER_HEADER = "x-smartcache-user"
_SESSION_OK = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,200}$")
KEY = "key"  # the kind of a credential that is the key's value itself, whatever carried it
# Authorization schemes whose value is the key itself
KEY_SCHEMES = frozenset({"bearer", "token", "key", "apikey", "api-key"})
# a legitimate client sends one key, or a few on the way through gateways
MAX_CREDENTIALS = 8


@dataclass(frozen=True, slots=True)
class Identity:
    tenant: str
    session: str
    user: str | None
    session_explicit: bool

    @property
    def anonymous(self) -> bool:
        return self.tenant == ANONYMOUS

    @property
    def indistinct(self) -> bool:
        """An anonymous caller with neither a session header nor a user id: nothing tells it apart
        from another person who opens with the same words (its derived session is theirs too)."""
        return self.anonymous and not self.session_explicit and self.user is None


# (kind, value): ``KEY`` and the key's value, or another scheme and its credential
Credential = tuple[str, str]


def authorization_credential(authorization: str | None) -> Credential | None:
    """The credential of an Authorization header: the key itself after a key scheme
    (``KEY_SCHEMES``, case-insensitive; the key is not) or alone; any other scheme with its value;
    None for no header, or a key scheme with no key."""
    credential = (authorization or "").strip()
    scheme, _, value = credential.partition(" ")
    value = value.strip()
    if scheme.lower() in KEY_SCHEMES:
        return (KEY, value) if value else None
    if not value:
        return (KEY, credential) if credential else None
    return (scheme.lower(), value)


# query parameters that carry a credential (names compared lower-case with "-" as "_")
QUERY_CREDENTIALS = frozenset(
    {"api_key", "apikey", "key", "token", "access_token", "auth", "secret", "password", "sig", "signature", "code"}
)

# headers other than Authorization that carry a credential (Azure OpenAI's ``api-key``, gateways'
# ``x-api-key``): the upstream authenticates by them, so the cache must key on them too
HEADER_CREDENTIALS = ("api-key", "x-api-key", "x-goog-api-key", "ocp-apim-subscription-key")


def credentials(
    authorization: str | None, headers: Mapping[str, str], query: Sequence[tuple[str, str]] = ()
) -> frozenset[Credential]:
    """Every distinct credential the caller sends: the Authorization header, the credential headers
    (``HEADER_CREDENTIALS``) and the query string's (``QUERY_CREDENTIALS``); empty values are none."""
    found = {authorization_credential(authorization)}
    found.update((KEY, value.strip()) for name in HEADER_CREDENTIALS for value in _every(headers, name))
    found.update((KEY, v.strip()) for k, v in query if k.lower().replace("-", "_") in QUERY_CREDENTIALS)
    return frozenset(c for c in found if c is not None and c[1])


def credential_part(credential: Credential, *, salt: str) -> str:
    """One credential's salted hash, the part of every tenant id it is in. The JSON array keeps
    kind and value apart whatever characters they hold."""
    material = json.dumps([salt, *credential], ensure_ascii=False)
    return hashlib.sha256(material.encode()).hexdigest()[:24]


def tenant_of_credentials(found: Iterable[Credential], *, salt: str) -> str:
    """``t-`` and the sorted hashes of the distinct credentials, joined by ``+``; anonymous for none."""
    parts = sorted({credential_part(c, salt=salt) for c in found})
    if not parts:
        return ANONYMOUS
    if len(parts) > MAX_CREDENTIALS:
        raise InvalidRequest(f"send at most {MAX_CREDENTIALS} distinct credentials", param="Authorization")
    return "t-" + "+".join(parts)


def tenant_parts(tenant: str) -> frozenset[str]:
    """The credential hashes a tenant id is made of (none for the anonymous tenant)."""
    return frozenset(tenant[2:].split("+")) if tenant.startswith("t-") else frozenset()


def key_tenant(api_key: str, *, salt: str) -> str:
    """The tenant of one key sent alone, by any carrier."""
    return tenant_of_credentials([(KEY, api_key.strip())] if api_key.strip() else [], salt=salt)


def tenant_of(authorization: str | None, *, salt: str) -> str:
    """The tenant of an Authorization header sent alone."""
    credential = authorization_credential(authorization)
    return tenant_of_credentials([credential] if credential else [], salt=salt)


def _every(headers: Mapping[str, str], name: str) -> list[str]:
    # a repeated credential header is every one of its values: upstream may read any of them
    getall = getattr(headers, "getall", None)
    if getall is not None:
        return list(getall(name, []))
    value = headers.get(name)
    return [] if value is None else [value]


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
    differently comes from the policy's scopes, never from the session id. An anonymous caller
    with no user id is known by nothing else, so two people sharing an opening would share this
    session: it is served only answers its own conversation already carries (``Identity.indistinct``,
    proxy/service/reach.py)."""
    first_user = next((m.text for m in request.messages if m.role == "user"), "")
    who = user if user is not None else request.user or ""
    material = "\x1f".join((tenant, who, request.model, request.system_text, opening(first_user)))
    return "d-" + hashlib.sha256(material.encode()).hexdigest()[:24]


def caller_tenant(headers: Mapping[str, str], *, salt: str, query: Sequence[tuple[str, str]] = ()) -> str:
    """The tenant of every credential the caller sends: the Authorization header, the other
    credential headers, and the query string (which goes upstream with a chat request)."""
    return tenant_of_credentials(credentials(_one_authorization(headers), headers, query), salt=salt)


def identify(
    headers: Mapping[str, str], request: ChatRequest, *, salt: str, query: Sequence[tuple[str, str]] = ()
) -> Identity:
    """``query``: the request's query string as pairs, which goes upstream with it."""
    tenant = caller_tenant(headers, salt=salt, query=query)
    explicit = clean_header_id(headers.get(SESSION_HEADER), SESSION_HEADER)
    user = clean_header_id(headers.get(USER_HEADER), USER_HEADER) or request.user
    session = explicit or derived_session(tenant, request, user=user)
    return Identity(tenant=tenant, session=session, user=user, session_explicit=explicit is not None)
