"""Who is asking: a credential in the query string (which goes upstream with a chat request) is
a tenant of its own, with the Authorization header, and never the anonymous or a Bearer tenant."""

from __future__ import annotations

import pytest

from proxy.core.identity import ANONYMOUS, query_tenant, tenant_of

SALT = "salt"


@pytest.mark.parametrize(
    ("authorization", "query", "same_as"),
    [
        (None, [("api-version", "2024-06-01")], None),  # no credential in it: the header decides
        (None, [], None),
        ("Bearer k", [("api-version", "1"), ("limit", "5")], None),
    ],
)
def test_a_query_without_a_credential_leaves_the_tenant_to_the_header(
    authorization: str | None, query: list[tuple[str, str]], same_as: None
) -> None:
    assert query_tenant(authorization, query, salt=SALT) is same_as


@pytest.mark.parametrize("name", ["api-key", "api_key", "API-KEY", "key", "token", "access_token", "code", "sig"])
def test_each_credential_name_makes_a_tenant(name: str) -> None:
    tenant = query_tenant(None, [(name, "k1")], salt=SALT)
    assert tenant is not None and tenant.startswith("q-")


def test_query_tenants_are_apart_by_key_by_header_and_from_every_other_tenant() -> None:
    one = query_tenant(None, [("api-key", "k1")], salt=SALT)
    assert one == query_tenant(None, [("api-version", "2"), ("api-key", "k1")], salt=SALT)
    others = {
        query_tenant(None, [("api-key", "k2")], salt=SALT),
        query_tenant("Bearer b", [("api-key", "k1")], salt=SALT),
        query_tenant(None, [("api-key", "k1")], salt="other-salt"),
        tenant_of("Bearer k1", salt=SALT),
        ANONYMOUS,
    }
    assert one not in others and len(others) == 5


def test_a_key_in_an_azure_or_gateway_header_is_a_tenant_of_its_own() -> None:
    from multidict import CIMultiDict

    from proxy.core.identity import identify
    from proxy.core.openai.request import parse_chat_request

    request = parse_chat_request(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}')

    def tenant(**headers: str) -> str:
        return identify(CIMultiDict(headers), request, salt=SALT).tenant

    one, two = tenant(**{"api-key": "k1"}), tenant(**{"api-key": "k2"})
    assert one != two and ANONYMOUS not in (one, two)  # before: both the anonymous tenant
    assert one == tenant(**{"API-Key": "k1"}) and one.startswith("h-")
    assert tenant(**{"x-api-key": "k1"}) not in (one, two, tenant())
    assert tenant(**{"api-key": "k1", "Authorization": "Bearer b"}) != one
    assert tenant(**{"api-key": " "}) == tenant() == ANONYMOUS
