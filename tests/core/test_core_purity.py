"""The pure core, imported for real: no module of it loads an adapter, a model runtime or the event
loop. The modules and what they may not reach are pyproject's "pure-core" import contract; this
test adds what the static graph cannot see, such as a package's __init__ loaded with its submodule.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
import tomllib
from importlib import import_module
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# Run in a fresh interpreter, which has loaded none of them: each module is imported in turn, and
# a forbidden module is charged to the first import that loaded it.
PROBE = """
import json, sys
modules, forbidden = json.loads(sys.argv[1])
def loaded():
    return {m for m in sys.modules for f in forbidden if m == f or m.startswith(f + ".")}
seen, charged = loaded(), {}
for name in modules:
    __import__(name)
    new = loaded() - seen
    seen |= new
    if new:
        charged[name] = sorted(new)
print(json.dumps(charged))
"""


def pure_core_contract() -> dict[str, Any]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c.get("id") == "pure-core")


def with_submodules(names: list[str]) -> list[str]:
    out: list[str] = []
    for name in names:
        out.append(name)
        path = getattr(import_module(name), "__path__", None)
        if path is not None:
            out += sorted(m.name for m in pkgutil.walk_packages(path, prefix=name + "."))
    return out


def forbidden_loads(modules: list[str], forbidden: list[str]) -> dict[str, list[str]]:
    run = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps([modules, forbidden])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    charged: dict[str, list[str]] = json.loads(run.stdout)
    return charged


def test_the_pure_core_loads_nothing_it_is_forbidden() -> None:
    contract = pure_core_contract()
    modules = with_submodules(contract["source_modules"])
    assert "proxy.core.decision.decide" in modules and "proxy.core.text.normalize" in modules
    assert forbidden_loads(modules, contract["forbidden_modules"]) == {}


def test_the_probe_sees_a_forbidden_load() -> None:
    """The check can fail: a module that loads the event loop is charged with it."""
    charged = forbidden_loads(["proxy.core.text.normalize", "proxy.microbatch"], ["asyncio", "proxy.microbatch"])
    assert set(charged) == {"proxy.microbatch"}
    assert {"asyncio", "proxy.microbatch"} <= set(charged["proxy.microbatch"])
