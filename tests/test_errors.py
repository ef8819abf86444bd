"""proxy/errors.py: one error tree. Every exception class the package defines derives from
``SmartCacheError``, and those that callers catch by a builtin base keep it."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import proxy
from proxy.embedding.errors import PackError
from proxy.errors import ClientError, ConfigError, ServiceError, SmartCacheError, UpstreamError
from proxy.microbatch import Overloaded
from proxy.policy import PolicyError
from proxy.policy_values import BadValue
from proxy.settings import SettingsError
from proxy.storage.base import StoreMismatch, StoreUnavailable
from proxy.tools.datasets.traces import TraceError
from proxy.upstream.engine import EngineError
from proxy.verify import VerifierError


def _package_modules() -> list[str]:
    """Every module of the package that imports here; ``__main__`` modules run a CLI on import."""
    names = []
    for info in pkgutil.walk_packages(proxy.__path__, "proxy."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        try:
            importlib.import_module(info.name)
        except ImportError as exc:  # an optional extra (train, report, engine) not installed
            if (exc.name or "").startswith("proxy"):
                raise
            continue
        names.append(info.name)
    return names


def _exception_classes() -> dict[str, type[BaseException]]:
    found = {}
    for name in _package_modules():
        for _, cls in inspect.getmembers(importlib.import_module(name), inspect.isclass):
            # a Warning is issued through warnings.warn as a category, never raised as an error
            if cls.__module__ == name and issubclass(cls, BaseException) and not issubclass(cls, Warning):
                found[f"{name}.{cls.__qualname__}"] = cls
    return found


def test_every_exception_class_is_in_the_tree() -> None:
    found = _exception_classes()
    assert len(found) >= 20  # the walk found the package, not an empty list
    outside = sorted(name for name, cls in found.items() if not issubclass(cls, SmartCacheError))
    assert outside == []


@pytest.mark.parametrize(
    ("cls", "branch", "builtin"),
    [
        (SettingsError, ConfigError, ValueError),
        (PolicyError, ConfigError, ValueError),
        (BadValue, ConfigError, Exception),
        (PackError, ConfigError, Exception),
        (StoreMismatch, ConfigError, ValueError),
        (TraceError, ConfigError, ValueError),
        (VerifierError, ConfigError, Exception),
        (StoreUnavailable, ServiceError, RuntimeError),
        (EngineError, ServiceError, RuntimeError),
        (Overloaded, ServiceError, Exception),
    ],
)
def test_branch_and_builtin_base(cls: type[Exception], branch: type[SmartCacheError], builtin: type[Exception]) -> None:
    assert issubclass(cls, branch)
    assert issubclass(cls, builtin)
    assert not issubclass(cls, ClientError | UpstreamError)  # never answered to a client as its own fault


def test_domain_errors_keep_their_fields_and_message() -> None:
    settings = SettingsError("env", "port", "expected int")
    assert (str(settings), settings.message, settings.key) == ("env: port: expected int",) * 2 + ("port",)
    policy = PolicyError("p.yaml", "intents.x", "bad")
    assert (str(policy), policy.file) == ("p.yaml: intents.x: bad", "p.yaml")
    busy = Overloaded("embedder", "full")
    assert (str(busy), busy.name, busy.why) == ("embedder overloaded: full", "embedder", "full")
    assert str(PackError("missing")) == "missing"
