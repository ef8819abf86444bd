"""Who is asking: a tenant is the key's value, whatever carries it (the Authorization header, a
credential header, the query string); several distinct keys sent together are a tenant of their
own, never one of theirs alone; the anonymous tenant is everyone without a key."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from proxy.core.errors import InvalidRequest
from proxy.core.identity import (
    ANONYMOUS,
    MAX_CREDENTIALS,
    Identity,
    caller_tenant,
    identify,
    key_tenant,
    tenant_of,
    tenant_parts,
)
from proxy.core.openai.request import parse_chat_request

SALT = "salt"
REQUEST = parse_chat_request(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}')


def tenant(query: str = "", **headers: str) -> str:
    pairs = [tuple(p.split("=", 1)) for p in query.split("&") if p]
    return caller_tenant(CIMultiDict(headers), salt=SALT, query=[(k, v) for k, v in pairs])


# every way a client may carry the key K
CARRIERS_OF_K = [
    ({"Authorization": "Bearer K"}, ""),
    ({"Authorization": "bearer   K "}, ""),
    ({"Authorization": "Token K"}, ""),
    ({"Authorization": "K"}, ""),  # a bare key: the header's value is the key itself
    ({"api-key": "K"}, ""),
    ({"API-Key": " K"}, ""),
    ({"x-api-key": "K"}, ""),
    ({"x-goog-api-key": "K"}, ""),
    ({"ocp-apim-subscription-key": "K"}, ""),
    ({}, "api-key=K"),
    ({}, "api_key=K"),
    ({}, "key=K"),
    ({}, "token=K&api-version=2024-06-01"),
    # the same key by two carriers at once is still one key
    ({"Authorization": "Bearer K", "api-key": "K"}, ""),
    ({"x-api-key": "K"}, "key=K"),
]


@pytest.mark.parametrize(("headers", "query"), CARRIERS_OF_K)
def test_every_carrier_of_one_key_is_one_tenant(headers: dict[str, str], query: str) -> None:
    assert tenant(query, **headers) == key_tenant("K", salt=SALT) == tenant_of("Bearer K", salt=SALT)


@pytest.mark.parametrize(
    ("headers", "query"),
    [
        ({"Authorization": "Bearer A", "api-key": "B"}, ""),
        ({"Authorization": "Bearer A", "x-api-key": "B"}, ""),
        ({"api-key": "A", "x-goog-api-key": "B"}, ""),
        ({"Authorization": "Bearer A"}, "api-key=B"),
        ({"x-api-key": "B"}, "key=A"),
        ({}, "key=A&token=B"),
        ({"Authorization": "Basic A", "api-key": "B"}, ""),
    ],
)
def test_two_keys_together_are_neither_key_alone(headers: dict[str, str], query: str) -> None:
    both = tenant(query, **headers)
    alone = {key_tenant("A", salt=SALT), key_tenant("B", salt=SALT), tenant_of("Basic A", salt=SALT), ANONYMOUS}
    assert both not in alone
    # its id names each key's part, so a purge by either key finds it (proxy/http/admin.py)
    assert tenant_parts(key_tenant("B", salt=SALT)) <= tenant_parts(both)


def test_two_keys_are_one_tenant_whatever_carries_which() -> None:
    both = tenant(**{"Authorization": "Bearer A", "api-key": "B"})
    assert both == tenant(**{"Authorization": "Bearer B", "api-key": "A"}) == tenant("key=A", **{"x-api-key": "B"})
    assert both == tenant(**{"Authorization": "Bearer A", "api-key": "B", "x-api-key": "A"})


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Bearer k1", "Bearer k2"),
        ("Bearer k1", "Bearer K1"),  # the scheme is case-insensitive, the key is not
        ("Bearer k1", "Bearer k1 padding"),
        ("Bearer k1", "Basic k1"),  # Basic's value encodes a user and a password, not a key
        ("Basic k1", "Basic k2"),
        ("Basic k1", "Digest k1"),
        ("Bearer k1", "Bearer k1x"),
    ],
)
def test_different_keys_never_share_a_tenant(a: str, b: str) -> None:
    assert tenant_of(a, salt=SALT) != tenant_of(b, salt=SALT)
    assert ANONYMOUS not in (tenant_of(a, salt=SALT), tenant_of(b, salt=SALT))


def test_a_key_with_a_separator_in_it_is_not_two_keys() -> None:
    """The query string can carry any character: a key holding the separator of a set's material
    must not spell the set of its halves."""
    assert tenant("key=a\x1fb") != tenant("key=a&token=b")
    assert tenant('key=["a", "b"]') != tenant("key=a&token=b")


@pytest.mark.parametrize(
    ("headers", "query"),
    [
        ({}, ""),
        ({"Authorization": ""}, ""),
        ({"Authorization": "Bearer "}, ""),
        ({"Authorization": "Bearer"}, ""),
        ({"api-key": " "}, ""),
        ({}, "api-version=2024-06-01&limit=5"),  # no credential in the query
        ({}, "key="),
    ],
)
def test_no_key_is_the_anonymous_tenant(headers: dict[str, str], query: str) -> None:
    assert tenant(query, **headers) == ANONYMOUS


def test_the_salt_makes_tenants_of_one_installation_only() -> None:
    assert key_tenant("K", salt=SALT) != key_tenant("K", salt="other-installation")


def test_more_credentials_than_a_client_sends_are_refused() -> None:
    many = "&".join(f"key=k{i}" for i in range(MAX_CREDENTIALS + 1))
    with pytest.raises(InvalidRequest):
        tenant(many)


def test_two_authorization_headers_are_refused() -> None:
    headers = CIMultiDict([("Authorization", "Bearer A"), ("Authorization", "Bearer B")])
    with pytest.raises(InvalidRequest):
        caller_tenant(headers, salt=SALT)


def test_a_repeated_credential_header_is_every_value_it_carries() -> None:
    headers = CIMultiDict([("api-key", "A"), ("api-key", "B")])
    assert caller_tenant(headers, salt=SALT) == tenant(**{"Authorization": "Bearer A", "x-api-key": "B"})


def who(**headers: str) -> Identity:
    return identify(CIMultiDict(headers), REQUEST, salt=SALT)


def test_only_an_anonymous_caller_without_session_or_user_is_indistinct() -> None:
    assert who().indistinct and who().anonymous
    assert not who(**{"x-smartcache-session": "s"}).indistinct
    assert not who(**{"x-smartcache-user": "u"}).indistinct
    assert not who(Authorization="Bearer K").indistinct
    with_body_user = parse_chat_request(b'{"model": "m", "user": "u", "messages": [{"role": "user", "content": "hi"}]}')
    assert not identify(CIMultiDict(), with_body_user, salt=SALT).indistinct
