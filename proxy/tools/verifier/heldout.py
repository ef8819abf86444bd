"""The rows the replay harness's dev traces were built from, which nothing may train on.

``/work/shared/eval/build_dev_traces.py`` (``eval/`` beside the data dir) samples PAWS-X and QQP
pairs and GECOR / CQR-KVRET dialogues with ``random.Random(11)``. Its functions are run here, in
its order and with its seed, so the selection is reproduced exactly rather than re-implemented;
the traces file it wrote, when present, is read too and its texts are added (belt and braces).
"""

from __future__ import annotations

import importlib.util
import json
import random
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from proxy.tools.verifier.pairs import text_key

__all__ = ["EVAL_SEED", "EvalRows", "eval_rows"]

EVAL_SEED = 11


@dataclass(frozen=True)
class EvalRows:
    """Text keys of every user turn in the traces, and the user-turn sequences of used dialogues."""

    texts: frozenset[str]
    dialogue_prefixes: frozenset[tuple[str, ...]]

    def holds_dialogue(self, user_turns: list[str]) -> bool:
        """Whether a dialogue (its user turns in order) opens like a traced conversation."""
        keys = tuple(text_key(t) for t in user_turns)
        return any(keys[: len(prefix)] == prefix for prefix in self.dialogue_prefixes)


def _builder(eval_dir: Path) -> ModuleType:
    path = eval_dir / "build_dev_traces.py"
    spec = importlib.util.spec_from_file_location("smartcache_dev_traces", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _conversations(eval_dir: Path, data: Path) -> list[dict[str, Any]]:
    module = _builder(eval_dir)
    module.DATA = data
    rng = random.Random(EVAL_SEED)
    convs: list[dict[str, Any]] = []
    for step in ("en_followup", "en_kvret", "zh_pairs", "en_pairs"):
        convs += getattr(module, step)(rng)
    return convs + module.examples()


def eval_rows(data: Path, eval_dir: Path | None = None) -> EvalRows:
    eval_dir = eval_dir or data.parent / "eval"
    convs = _conversations(eval_dir, data)
    traces = eval_dir / "dev_traces.jsonl"
    if traces.is_file():
        convs += [json.loads(line) for line in traces.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = {text_key(t["user"]) for c in convs for t in c["turns"]}
    prefixes = set()
    for c in convs:
        users = [text_key(t["user"]) for t in c["turns"]]
        if c["category"] == "en_followup":
            # the last turn may be the restatement appended to the dialogue's own turns
            prefixes.add(tuple(users[:-1]) if len(users) > 1 and c["id"].endswith("-0") else tuple(users))
        elif c["category"] == "en_kvret" and not c["id"].endswith("-p"):
            prefixes.add(tuple(users[:-1]))
    return EvalRows(frozenset(texts), frozenset(p for p in prefixes if p))
