"""The chat handler's options: read from the settings once; a flavour the handler cannot speak is
refused when they are built."""

from __future__ import annotations

import pytest

from proxy.http.chat import ChatOptions
from proxy.upstream.hints import FLAVOURS, as_flavour


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_every_upstream_flavour_is_an_option(flavour: str) -> None:
    assert ChatOptions(flavour=as_flavour(flavour)).flavour == flavour


def test_an_unknown_flavour_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown upstream flavour 'tgi'; expected one of"):
        as_flavour("tgi")


def test_the_defaults_retry_once_and_race_nothing() -> None:
    options = ChatOptions()
    assert (options.retry, options.race, options.slot_count, options.debug_headers) == (True, frozenset(), None, False)
