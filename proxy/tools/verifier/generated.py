"""Pairs generated from training texts, for what the pair sets teach too rarely.

Each generator takes a training text and changes it the way a near-miss request differs from a
cached one, keeping almost every word, so the verifier learns that wording overlap is not
sameness (PAWS was built the same way):

- ``negated``: a "why / how come" question or a statement with its modal negated ("为什么花呗
  能用" / "为什么花呗不能用", "Why can I log in?" / "Why can't I log in?") → different. Yes-no
  questions are left alone: "可以分期吗" and "不可以分期吗" ask the same thing.
- ``roles_swapped``: a direction or comparison with its two ends exchanged ("从北京到上海" /
  "从上海到北京", "Is Python faster than Java?" / "Is Java faster than Python?") → different;
  "the difference between A and B" / "between B and A" → the same.
- ``place_swapped``: one known place replaced by another ("杭州的天气" / "苏州的天气") → different.

Numbers changed are in ``dataset.numbers_changed``. Only texts of the training split are read,
so no generated row carries a held-out text.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable, Sequence

from proxy.core.text.gazetteer import PLACE_ALIASES
from proxy.tools.verifier.pairs import LabeledPair
from proxy.verify import PairSide

__all__ = ["GENERATORS", "generate", "negated", "place_swapped", "roles_swapped"]

_WHY_ZH = re.compile(r"为什么|为啥|怎么会|咋")
_ZH_MODAL = re.compile(r"(?<![不没])(能|可以|会|是|要)(?!不)")
_ZH_HAVE = re.compile(r"(?<![没])有(?!没)")
_WHY_EN = re.compile(r"^\s*(why|how come)\b", re.I)
_EN_MODAL = re.compile(r"\b(can|could|should|would|will|is|are|was|were|does|do|did|has|have)\b(?!\s*(not|n't))", re.I)
_EN_NOT = {"can": "can't", "will": "won't"}

_ZH_PLACE = "|".join(
    sorted((p for p in set(PLACE_ALIASES.values()) if re.fullmatch(r"[\u4e00-\u9fff]+", p)), key=len, reverse=True)
)
_EN_PLACE = "|".join(
    sorted((re.escape(a) for a in PLACE_ALIASES if re.fullmatch(r"[a-z' ]+", a) and len(a) > 3), key=len, reverse=True)
)
_ZH_ROUTE = re.compile(rf"({_ZH_PLACE})(到|去|飞|至|开往|发往)({_ZH_PLACE})")
_ZH_COMPARE = re.compile(rf"({_ZH_PLACE})比({_ZH_PLACE})")
_EN_ROUTE = re.compile(rf"\bfrom ({_EN_PLACE}) to ({_EN_PLACE})\b", re.I)
_EN_COMPARE = re.compile(
    r"\b([A-Z][\w+#.]*) (better|worse|faster|slower|bigger|smaller|cheaper|safer|harder|easier|older|stronger) "
    r"than ([A-Z][\w+#.]*)"
)
_EN_BETWEEN = re.compile(r"\bdifferences? between (\w[\w+#.]*) and (\w[\w+#.]*)\s*[?.!]*\s*$", re.I)
_ZH_PLACE_ANY = re.compile(_ZH_PLACE)
_EN_PLACE_ANY = re.compile(rf"\b({_EN_PLACE})\b", re.I)


def negated(text: str, rng: random.Random) -> tuple[str, int] | None:
    if _WHY_ZH.search(text):
        matches = list(_ZH_MODAL.finditer(text)) or list(_ZH_HAVE.finditer(text))
        if not matches:
            return None
        m = rng.choice(matches)
        word = "没" if m.group() == "有" else "不"
        return text[: m.start()] + word + text[m.start() :], 0
    if _WHY_EN.search(text):
        modal = _EN_MODAL.search(text)
        if modal is None:
            return None
        word = modal.group()
        neg = _EN_NOT.get(word.lower(), word + "n't")
        if word[0].isupper():
            neg = neg[0].upper() + neg[1:]
        return text[: modal.start()] + neg + text[modal.end() :], 0
    return None


def roles_swapped(text: str, rng: random.Random) -> tuple[str, int] | None:
    for pattern, label in ((_ZH_ROUTE, 0), (_ZH_COMPARE, 0), (_EN_ROUTE, 0), (_EN_COMPARE, 0), (_EN_BETWEEN, 1)):
        m = pattern.search(text)
        if m is None:
            continue
        a, b = 1, m.lastindex or 1
        if m.group(a).lower() == m.group(b).lower():
            return None
        return (
            text[: m.start(a)] + m.group(b) + text[m.end(a) : m.start(b)] + m.group(a) + text[m.end(b) :],
            label,
        )
    return None


def place_swapped(text: str, rng: random.Random) -> tuple[str, int] | None:
    zh = list(_ZH_PLACE_ANY.finditer(text))
    en = list(_EN_PLACE_ANY.finditer(text))
    matches = zh or en
    if not matches:
        return None
    m = rng.choice(matches)
    pool = sorted({p for p in PLACE_ALIASES.values()} if zh else {a for a in PLACE_ALIASES if a.isascii()})
    canonical = PLACE_ALIASES.get(m.group().lower(), m.group())
    choices = [p for p in pool if PLACE_ALIASES.get(p, p) != canonical]
    other = rng.choice(choices)
    if m.group()[:1].isupper():
        other = other.title()
    return text[: m.start()] + other + text[m.end() :], 0


Generator = Callable[[str, random.Random], "tuple[str, int] | None"]
GENERATORS: dict[str, Generator] = {
    "gen_negated": negated,
    "gen_roles_swapped": roles_swapped,
    "gen_place_swapped": place_swapped,
}


def _texts(pairs: Iterable[LabeledPair]) -> list[str]:
    return sorted({s.question for p in pairs for s in (p.a, p.b) if not s.previous_question})


def generate(pairs: Sequence[LabeledPair], rng: random.Random, limit: int) -> list[LabeledPair]:
    """Up to ``limit`` rows per generator from the texts of ``pairs`` (seeded, deterministic)."""
    texts = _texts(pairs)
    out: list[LabeledPair] = []
    for source, make in GENERATORS.items():
        order = list(texts)
        rng.shuffle(order)
        made = 0
        for text in order:
            if made >= limit:
                break
            changed = make(text, rng)
            if changed is None or changed[0] == text:
                continue
            out.append(LabeledPair(source, PairSide(text), PairSide(changed[0]), changed[1]))
            made += 1
    return out
