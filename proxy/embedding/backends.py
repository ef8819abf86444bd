"""Blocking text embedders behind one small protocol.

Two runtimes cover every pack: fastembed (a catalog model, or a local directory holding an
ONNX encoder plus ``tokenizer.json``) and a plain ONNX Runtime session for graphs that take
raw strings (the multilingual Universal Sentence Encoder, whose SentencePiece tokenizer is an
onnxruntime-extensions custom op inside the graph). Both return float32, L2-normalised rows.

These classes block; the async micro-batching layer runs them on one worker thread.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from onnxruntime import InferenceSession
    from tokenizers import Tokenizer

__all__ = [
    "FastEmbedEmbedder",
    "StringOnnxEmbedder",
    "SyncEmbedder",
    "l2_normalise",
    "length_groups",
]

Matrix = npt.NDArray[np.float32]

# On CPU these encoders are compute-bound from one text up (about 4,300 tokens/s per core for
# e5-small, whether 1 or 8 texts of 32 tokens go in a run), so batching saves only the small
# per-run overhead, while padding to the longest text in a run costs real compute: a
# micro-batch mixes 10-token questions with 90-token contexts. Texts are therefore run in
# groups of similar token length, wasting at most this fraction on padding.
_PADDING_SLACK = 0.25

# ONNX Runtime's pool threads spin after each run, waiting for the next. In a proxy that shares
# its cores with its own event loop and the requests it serves, that is CPU taken from them: a
# lone miss is faster spinning, but a loaded proxy serves fewer requests with more CPU
# (bench_proxy.py for the lone miss, soak.py --phases load under load; docs/architecture.md,
# "Quiet model threads").
QUIET_THREADS = {"session.intra_op.allow_spinning": "0", "session.inter_op.allow_spinning": "0"}


@runtime_checkable
class SyncEmbedder(Protocol):
    """A blocking embedder: ``embed`` returns float32 rows of unit length, one per text."""

    name: str
    dim: int
    max_tokens: int

    def embed(self, texts: Sequence[str]) -> Matrix: ...

    def count_tokens(self, text: str) -> int: ...


def l2_normalise(rows: npt.NDArray[np.floating]) -> Matrix:
    """Rows scaled to unit length (zero rows stay zero) as a contiguous float32 matrix."""
    matrix = np.asarray(rows, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return np.ascontiguousarray(matrix / np.maximum(norms, 1e-12), dtype=np.float32)


def length_groups(lengths: Sequence[int], slack: float) -> list[list[int]]:
    """Indices cut into runs of similar length whose padding wastes at most ``slack``.

    A run padded to its longest member costs ``len(run) * max(run)``; a text joins the
    current run only while that stays within ``(1 + slack)`` times the tokens it really holds.
    """
    groups: list[list[int]] = []
    current: list[int] = []
    real = 0
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):
        # ascending order: the newcomer is the longest, so it sets the padded length
        if current and lengths[index] * (len(current) + 1) > (1 + slack) * (real + lengths[index]):
            groups.append(current)
            current, real = [], 0
        current.append(index)
        real += lengths[index]
    if current:
        groups.append(current)
    return groups


def _empty(dim: int) -> Matrix:
    return np.zeros((0, dim), dtype=np.float32)


class FastEmbedEmbedder:
    """fastembed ``TextEmbedding`` from a catalog name, or from a local model directory.

    A local directory needs an ONNX file (``model_file``), ``tokenizer.json`` and a
    ``tokenizer_config.json`` with ``model_max_length`` and a pad token. ``query_prefix`` is
    prepended to every text (e5 wants ``"query: "``); ``count_tokens`` counts it too, since it
    takes room in the model's window.
    """

    def __init__(
        self,
        model_name: str,
        *,
        model_dir: Path | None = None,
        threads: int | None = None,
        query_prefix: str = "",
        dim: int | None = None,
        model_file: str = "model.onnx",
        pooling: str = "MEAN",
    ) -> None:
        from fastembed import TextEmbedding

        self.name = model_name
        self.query_prefix = query_prefix
        if model_dir is None:
            self._model = TextEmbedding(model_name, threads=threads, cuda=False)
            self.dim = int(self._model.embedding_size)
            # where fastembed cached the files; not public API, so looked up defensively
            source_dir = Path(getattr(self._model.model, "_model_dir", ""))
        else:
            source_dir = Path(model_dir).resolve()
            self.dim = dim if dim is not None else _onnx_output_dim(source_dir / model_file)
            registered = _register_local_model(model_name, source_dir, self.dim, model_file, pooling)
            self._model = TextEmbedding(
                registered,
                threads=threads,
                cuda=False,
                cache_dir=str(source_dir),
                specific_model_path=str(source_dir),
            )
        _quieten(self._model, threads)
        self._tokenizer = _untruncated_tokenizer(source_dir / "tokenizer.json")
        self.max_tokens = _model_max_length(source_dir)

    def embed(self, texts: Sequence[str]) -> Matrix:
        if not texts:
            return _empty(self.dim)
        prefixed = [self.query_prefix + text for text in texts]
        lengths = [len(encoding.ids) for encoding in self._tokenizer.encode_batch(prefixed)]
        rows = np.empty((len(texts), self.dim), dtype=np.float32)
        for group in length_groups(lengths, _PADDING_SLACK):
            batch = [prefixed[i] for i in group]
            rows[group] = np.stack(list(self._model.embed(batch, batch_size=len(batch))))
        return l2_normalise(rows)

    def count_tokens(self, text: str) -> int:
        return len(self._tokenizer.encode(self.query_prefix + text).ids)


class StringOnnxEmbedder:
    """An ONNX graph that maps a 1-D string tensor to sentence embeddings (USE multilingual).

    ``tokenizer_file`` is a graph holding only the model's SentencePiece op, so
    ``count_tokens`` sees exactly the pieces the encoder sees.
    """

    def __init__(
        self,
        name: str,
        model_file: Path,
        *,
        tokenizer_file: Path,
        max_tokens: int,
        threads: int | None = None,
    ) -> None:
        self.name = name
        self.max_tokens = max_tokens
        self._session = _string_session(model_file, threads)
        self._tokenizer = _string_session(tokenizer_file, 1)
        self._input = self._session.get_inputs()[0].name
        self._tokenizer_input = self._tokenizer.get_inputs()[0].name
        self.dim = int(self._session.get_outputs()[0].shape[-1])

    def embed(self, texts: Sequence[str]) -> Matrix:
        if not texts:
            return _empty(self.dim)
        batch = np.asarray(list(texts), dtype=object)
        (rows,) = self._session.run(None, {self._input: batch})[:1]
        return l2_normalise(rows)

    def count_tokens(self, text: str) -> int:
        pieces = self._tokenizer.run(None, {self._tokenizer_input: np.asarray([text], dtype=object)})[0]
        return int(pieces.size)


def _string_session(model_file: Path, threads: int | None) -> InferenceSession:
    import onnxruntime as ort
    from onnxruntime_extensions import get_library_path

    options = ort.SessionOptions()
    options.register_custom_ops_library(get_library_path())
    if threads is not None:
        options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    for key, value in QUIET_THREADS.items():
        options.add_session_config_entry(key, value)
    return ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])


def _quieten(model: object, threads: int | None) -> None:
    """fastembed opens its session with ONNX Runtime's spinning threads and has no option against
    it, so the same graph is opened again with ``QUIET_THREADS`` in its place."""
    import onnxruntime as ort

    inner: Any = getattr(model, "model", None)
    session = getattr(inner, "model", None)
    path = getattr(session, "_model_path", None)
    if not isinstance(session, ort.InferenceSession) or not path:
        return  # another fastembed layout: keep its session as it is
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = threads
    for key, value in QUIET_THREADS.items():
        options.add_session_config_entry(key, value)
    inner.model = ort.InferenceSession(path, providers=session.get_providers(), sess_options=options)


def _untruncated_tokenizer(path: Path) -> Tokenizer:
    """The model's tokenizer without truncation, so long texts report their real length."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def _model_max_length(model_dir: Path, default: int = 512) -> int:
    config_path = model_dir / "tokenizer_config.json"
    if not config_path.exists():
        return default
    value = json.loads(config_path.read_text(encoding="utf-8")).get("model_max_length", default)
    # transformers writes a huge sentinel when the length is unknown
    return int(value) if isinstance(value, int) and 0 < value < 1_000_000 else default


def _onnx_output_dim(model_path: Path) -> int:
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    dims = model.graph.output[0].type.tensor_type.shape.dim
    if not dims or not dims[-1].HasField("dim_value"):
        raise ValueError(f"{model_path}: the output's last dimension is not static; pass dim=")
    return int(dims[-1].dim_value)


def _register_local_model(name: str, model_dir: Path, dim: int, model_file: str, pooling: str) -> str:
    """Register a local directory with fastembed once per process and return its model name.

    fastembed keeps custom models in a class-level registry and refuses a name twice, so the
    name is derived from everything that describes the model: the same directory loaded again
    reuses its entry, and a different one can never collide with it.
    """
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType

    key = f"{model_dir}|{dim}|{model_file}|{pooling}"
    registered = f"smartcache/{name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    known = {model.model.lower() for model in TextEmbedding._list_supported_models()}
    if registered.lower() not in known:
        TextEmbedding.add_custom_model(
            model=registered,
            pooling=PoolingType(pooling.upper()),
            normalization=True,
            sources=ModelSource(url=model_dir.as_uri()),
            dim=dim,
            model_file=model_file,
            description=f"local model directory {model_dir}",
        )
    return registered
