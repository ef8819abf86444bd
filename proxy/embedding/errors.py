"""The one error of the embedding packs."""

from __future__ import annotations

from proxy.core.errors import ConfigError


class PackError(ConfigError):
    """A pack is unknown, missing, broken or cannot be built; the message says what to run."""
