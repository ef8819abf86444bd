"""What a non-editable install (the image's) contains: setuptools packs only the packages
pyproject.toml lists, so a new subpackage left out of the list would be missing there while an
editable checkout still imports it."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_under_proxy_is_listed_for_the_wheel() -> None:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    on_disk = {".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "proxy").rglob("__init__.py")}
    listed = set(tool["packages"])
    assert on_disk <= listed, f"add to [tool.setuptools] packages: {sorted(on_disk - listed)}"
    for package in listed:
        source = tool.get("package-dir", {}).get(package, package.replace(".", "/"))
        assert (ROOT / source).is_dir(), package
