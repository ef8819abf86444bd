"""A pack's manifest: the sha256 of every file and the similarities of known probe pairs,
measured when the pack was built. Loading checks both, so a corrupted or half-copied pack, or
one whose runtime now computes other vectors, fails at start instead of signing wrongly."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from proxy.embedding.backends import SyncEmbedder
from proxy.embedding.errors import PackError

MANIFEST = "manifest.json"
FORMAT = 1
# A probe similarity measured at load may differ from the install-time value by thread count
# and kernel choice (~1e-6); a real change of weights or tokenizer moves it by far more.
PROBE_TOLERANCE = 0.01
# A paraphrase must beat the unrelated sentence by this much for a pack to be accepted.
PROBE_MARGIN = 0.05


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


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_table(root: Path) -> dict[str, dict[str, Any]]:
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)
    return {p.relative_to(root).as_posix(): {"sha256": sha256_of(p), "size": p.stat().st_size} for p in files}


def write_manifest(
    root: Path,
    *,
    pack: str,
    source: Mapping[str, str],
    backend: Mapping[str, Any],
    embedder: SyncEmbedder,
    languages: Sequence[str],
) -> None:
    """Measure the probes of the pack's languages (refusing a pack that cannot tell a paraphrase
    from an unrelated sentence) and write the manifest of the files as they are now."""
    probes = [measure(embedder, probe) for probe in PROBES if probe.language in languages]
    for measured in probes:
        if measured["pair"] - measured["non_pair"] < PROBE_MARGIN:
            raise PackError(f"pack {pack!r} failed its {measured['language']} probe pair: {measured}")
    manifest = {
        "format": FORMAT,
        "pack": pack,
        "source": dict(source),
        "backend": dict(backend),
        "files": file_table(root),
        "probes": probes,
    }
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False), encoding="utf-8")


def read_manifest(root: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    return manifest


def checksum_problem(root: Path) -> str | None:
    """What is wrong with an installed pack's files, or None when every checksum matches."""
    try:
        manifest = read_manifest(root)
    except (OSError, ValueError) as exc:
        return f"unreadable {MANIFEST}: {exc}"
    if manifest.get("format") != FORMAT:
        return f"{MANIFEST} format {manifest.get('format')!r}, expected {FORMAT}"
    if not {"pack", "backend", "files", "probes"} <= manifest.keys():
        return f"{MANIFEST} is incomplete"
    for relative, expected in manifest["files"].items():
        path = root / relative
        if not path.is_file():
            return f"{relative} is missing"
        if path.stat().st_size != expected["size"] or sha256_of(path) != expected["sha256"]:
            return f"{relative}: checksum mismatch"
    return None


def measure(embedder: SyncEmbedder, probe: Probe) -> dict[str, Any]:
    anchor, paraphrase, unrelated = embedder.embed([probe.anchor, probe.paraphrase, probe.unrelated])
    return {
        "language": probe.language,
        "pair": round(float(np.dot(anchor, paraphrase)), 6),
        "non_pair": round(float(np.dot(anchor, unrelated)), 6),
    }


def probe_drift(embedder: SyncEmbedder, recorded: list[dict[str, Any]]) -> str | None:
    """How the probes measured now differ from those measured at install, or None."""
    probes = {probe.language: probe for probe in PROBES}
    for expected in recorded:
        measured = measure(embedder, probes[expected["language"]])
        for key in ("pair", "non_pair"):
            if abs(measured[key] - expected[key]) > PROBE_TOLERANCE:
                return (
                    f"its {expected['language']} probe {key} similarity is {measured[key]:.4f}, "
                    f"{expected[key]:.4f} at install"
                )
    return None
