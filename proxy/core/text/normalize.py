"""Text normalisation for cache keys: width, whitespace, punctuation, numbers and units.

What comes out of here is only ever used to *sign* a conversation (embedding views, tags,
hashes); user text forwarded upstream is never rewritten.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import unicodedata
import warnings
from collections.abc import Sequence
from typing import Final, NewType, Protocol

import cn2an
import jieba
import jieba.posseg

# A text that went through normalize_text. The rules of this room (phrases, entities, the system
# version) read it and never normalise again: a request is normalised once, at the edge
# (proxy.core.conversation), and every later stage reads that value.
NormalText = NewType("NormalText", str)


def _wordset(words: str) -> frozenset[str]:
    return frozenset(words.split())


# Chinese punctuation that NFKC leaves alone, mapped to its ASCII twin so "谢谢，" == "谢谢,".
_PUNCT_TABLE: Final = str.maketrans(
    {
        "，": ",", "。": ".", "、": ",", "；": ";", "：": ":", "？": "?", "！": "!",
        "“": '"', "”": '"', "‘": "'", "’": "'", "「": '"', "」": '"', "『": '"', "』": '"',
        "【": "[", "】": "]", "〔": "[", "〕": "]", "（": "(", "）": ")", "～": "~", "〜": "~",
        "—": "-", "–": "-", "－": "-", "·": "·", "•": "*", "｡": ".", "､": ",",
    }
)  # fmt: skip

CJK: Final = r"\u3400-\u4dbf\u4e00-\u9fff"
_NUMERAL_CHARS: Final = "零〇一二两三四五六七八九十百千万亿"
_BASIC_DIGITS: Final = "零〇一二两三四五六七八九"
_NUMERAL_RUN: Final = re.compile(rf"[{_NUMERAL_CHARS}]+")
# 三点五公斤: a decimal, which jieba would split at 点 (三点 alone is a clock time).
_DECIMAL_NUMERAL: Final = re.compile(
    rf"[{_NUMERAL_CHARS}]+点[{_BASIC_DIGITS}]+(?=[万千亿]|公斤|千克|斤|克|kg|公里|千米|米|英寸|寸|倍|升|元|块|%|个小时|小时)"
)
# Words jieba tags as numerals that are not quantities ("一起", "十分感谢", "千万别").
_NOT_QUANTITIES: Final = _wordset(
    "一起 一下 一点 一点儿 一些 一定 一样 一般 一直 一切 一会 一会儿 一致 一旦 一边 一向 一半 一番 一同 "
    "一再 一律 一概 一时 一生 一路 一味 一口气 一方面 一度 一阵 一心 一面 一连 一带 一齐 一举 一贯 一早 "
    "一流 一手 一体 一并 一共 一一 十分 万一 千万 万万 五一 三心二意 一五一十 百分百 万分 千千万万 "
    "一家人 一下子 一模一样 独一无二 一言为定 一路顺风 一帆风顺 九九 一刻"
)
# Measure words after a lone digit that make it a quantity ("两晚", "三人").
_MEASURES: Final = _wordset(
    "天 晚 夜 个 款 件 人 位 本 台 部 家 种 条 句 段 篇 页 次 岁 元 块 斤 克 周 年 月 日 号 间 张 份 道 "
    "杯 瓶 双 套 只 辆 首 折 星 层 站 米 公里 公斤 千克 小时 分钟 秒 遍 行 字 项 点 门 节 章 名 对 组 场 "
    "晚上 毛 角 颗 支 把 封 款式 种类 周年 倍 成 室 厅 居 寸 英寸 升 度 分 页 秒钟 刻钟 星期 礼拜 个月 年级"
)
# "8k" stays "8k" when it means a resolution rather than 8000.
_K_SUFFIX: Final = re.compile(
    r"(?<![a-z0-9.])(\d+(?:\.\d+)?)\s?(k)(?![a-z0-9])(?!\s?(?:屏|显示|视频|分辨率|电视|display|screen|"
    r"video|monitor|tv|resolution|hdr|uhd|panel|gaming))"
)
# "1w" is 10000 only where money is meant: "65w充电器" is 65 watts.
_W_SUFFIX: Final = re.compile(
    r"(?:(?<=预算)|(?<=价格)|(?<=价位)|(?<=工资)|(?<=月薪)|(?<=年薪)|(?<=收入)|(?<=花了)|(?<=存款))\s?(\d+(?:\.\d+)?)(w)"
    r"(?![a-z0-9])|(?<![a-z0-9.])(\d+(?:\.\d+)?)(w)(?=\s?(?:元|块|以内|以下|之内|左右|上下|的预算|预算|rmb))"
)
_DIGIT_MAGNITUDE: Final = re.compile(r"(\d+(?:\.\d+)?)(亿|万|千|百)(?![米克瓦卡])")
_THOUSANDS: Final = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?![\d,])(?!\.\d)")
_SPACES: Final = re.compile(r"\s+")
_CJK_GAP: Final = re.compile(rf"(?<=[{CJK}])\s+|\s+(?=[{CJK}])")
_SPACE_BEFORE_PUNCT: Final = re.compile(r"\s+(?=[,.;:!?)\]])")
_REPEATED_PUNCT: Final = re.compile(r"([,;:!?~])\1+|\.{2,}")
_TRAILING_PUNCT: Final = re.compile(r"[\s,.;:!?~。]+$")
_MIXED_TERMINAL: Final = re.compile(r"[!?]{2,}")

_MULTIPLIERS: Final = {"k": 1000.0, "百": 100.0, "千": 1000.0, "万": 10000.0, "亿": 1e8}


def quiet_jieba() -> None:
    """Keep jieba's dictionary-building chatter off stderr."""
    logging.getLogger("jieba").setLevel(logging.WARNING)


class Cutter(Protocol):
    """What the text rules read of a segmenter: a text's words, and those words with their part of
    speech (``tag``). A ``Segmenter`` cuts; ``proxy.core.conversation.Cuts`` remembers what it
    cut."""

    def words(self, text: str) -> Sequence[str]: ...

    def tag(self, words: Sequence[str]) -> Sequence[tuple[str, str]]: ...


class Segmenter:
    """Owns a private jieba tokenizer (and its part-of-speech tagger) instead of jieba's global one.

    Building the dictionary is slow (a jieba start): the app builds one at start and hands it to the
    parts that read text (proxy.service.compose); ``default_segmenter()`` serves tests and offline callers
    that have none at hand.
    """

    def __init__(self) -> None:
        quiet_jieba()
        self._tokenizer = jieba.Tokenizer()
        self._tokenizer.initialize()
        self._pos = jieba.posseg.POSTokenizer(self._tokenizer)

    def words(self, text: str) -> list[str]:
        return list(self._tokenizer.cut(text))

    def tag(self, words: Sequence[str]) -> list[tuple[str, str]]:
        """Each word of a cut with its part of speech: the dictionary's, or for a word the dictionary
        lacks (a name its HMM found) the tagger's reading of that word alone. The tagger's own cut
        of the whole text would be a second, slower cut that splits some texts elsewhere."""
        table = self._pos.word_tag_tab
        return [(word, table.get(word) or self._unknown(word)) for word in words]

    def _unknown(self, word: str) -> str:
        if not word.strip():
            return "x"
        parts = list(self._pos.cut(word))
        return max(parts, key=lambda pair: len(pair.word)).flag if parts else "x"


def tagged_words(cutter: Cutter, text: str) -> Sequence[tuple[str, str]]:
    """``text``'s words, as ``cutter`` cuts them, with their parts of speech."""
    return cutter.tag(cutter.words(text))


@functools.cache
def default_segmenter() -> Segmenter:
    """A segmenter for callers that pass none (tests, benchmarks, one-off tools), built on first
    use and asked for only where a text is cut, so a caller that cuts nothing never builds it; the
    proxy passes its own everywhere and never builds this one."""
    return Segmenter()


def format_number(value: float) -> str:
    """8000.0 → "8000", 1.5 → "1.5"; one spelling per value so normalisation stays idempotent."""
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


def chinese_numeral_value(numeral: str) -> float | None:
    """cn2an in its lenient mode; None when the run is not a number ("两三" is a range, not 23)."""
    if len(numeral) == 2 and all(c in _BASIC_DIGITS for c in numeral) and numeral[0] != numeral[1]:
        return None  # 两三, 七八: approximate ranges
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return float(cn2an.cn2an(numeral, "smart"))
        except (ValueError, KeyError, IndexError, TypeError):
            return None


def _convert_word(word: str, next_word: str) -> str:
    """Rewrite the numerals of one jieba word when the word is a quantity."""
    if word in _NOT_QUANTITIES:
        return word
    match = _NUMERAL_RUN.search(word)
    if match is None:
        return word
    prefix, numeral, suffix = word[: match.start()], match.group(), word[match.end() :]
    if prefix not in ("", "第") or (suffix and not _starts_with_measure(suffix)):
        return word  # numeral inside an ordinary word or name (统一, 百度, 九转大肠, 十渡镇) or vague (十几)
    if numeral.endswith("千") and len(numeral) > 1 and suffix[:1] in ("米", "克", "瓦"):
        numeral, suffix = numeral[:-1], "千" + suffix  # 三千米 is 3 km: 千 belongs to the unit
    lone_digit = len(numeral) == 1 and numeral in _BASIC_DIGITS
    if lone_digit and not suffix and prefix != "第" and not _starts_with_measure(next_word):
        return word
    value = chinese_numeral_value(numeral)
    if value is None:
        return word
    return f"{prefix}{format_number(value)}{suffix}"


def _starts_with_measure(word: str) -> bool:
    return any(word.startswith(m) for m in _MEASURES)


def _convert_decimal(match: re.Match[str]) -> str:
    value = chinese_numeral_value(match.group())
    return match.group() if value is None else format_number(value)


def _convert_chinese_numerals(text: str, segmenter: Cutter | None) -> str:
    if not any(c in _NUMERAL_CHARS for c in text):
        return text
    text = _DECIMAL_NUMERAL.sub(_convert_decimal, text)
    words = (segmenter or default_segmenter()).words(text)
    out = [_convert_word(word, words[i + 1] if i + 1 < len(words) else "") for i, word in enumerate(words)]
    return "".join(out)


def _scale(match: re.Match[str]) -> str:
    return format_number(float(match.group(1)) * _MULTIPLIERS[match.group(2)])


def _scale_w(match: re.Match[str]) -> str:
    return format_number(float(match.group(1) or match.group(3)) * 10000)


def _convert_units(text: str) -> str:
    text = _THOUSANDS.sub(lambda m: m.group().replace(",", ""), text)
    text = _DIGIT_MAGNITUDE.sub(_scale, text)
    text = _W_SUFFIX.sub(_scale_w, text)
    return _K_SUFFIX.sub(_scale, text)


def _collapse_punctuation(text: str) -> str:
    text = _MIXED_TERMINAL.sub(lambda m: m.group()[0], text)
    return _REPEATED_PUNCT.sub(lambda m: "..." if m.group().startswith(".") else m.group(1), text)


# English number words in one form with digits ("three tips" = "3 tips"). "one" stays a word:
# it is a pronoun as often as a number ("which one", "one of them").
_EN_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")
_EN_NUMBERS = {w: str(i) for i, w in enumerate(_EN_WORDS) if i != 1}
_EN_TENS = {
    w: 10 * (i + 2)
    for i, w in enumerate(("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"))
}
_EN_NUMBERS.update({w: str(n) for w, n in _EN_TENS.items()} | {"hundred": "100"})
_EN_NUMBER = re.compile(r"\b(" + "|".join(_EN_NUMBERS) + r")\b")
# "forty-five" is 45, not "40-5"
_EN_COMPOUND = re.compile(r"\b(" + "|".join(_EN_TENS) + r")[- ](" + "|".join(_EN_WORDS[1:10]) + r")\b")


def _en_numbers(text: str) -> str:
    text = _EN_COMPOUND.sub(lambda m: str(_EN_TENS[m.group(1)] + _EN_WORDS.index(m.group(2))), text)
    return _EN_NUMBER.sub(lambda m: _EN_NUMBERS[m.group(1)], text)


def normalize_text(text: str, *, segmenter: Cutter | None = None) -> NormalText:
    """One canonical spelling of a text for signing; idempotent.

    NFKC folds full-width forms, punctuation is mapped to ASCII, whitespace collapsed (and dropped
    between CJK characters), latin lower-cased, numbers and units in one form (八千 → 8000,
    两万五 → 25000, 8k → 8000, 1.5万 → 15000, 三天 → 3天), trailing punctuation dropped
    (谢谢！ == 谢谢).
    """
    text = unicodedata.normalize("NFKC", text).lower().translate(_PUNCT_TABLE)
    text = _SPACES.sub(" ", text).strip()
    text = _CJK_GAP.sub("", text)
    text = _SPACE_BEFORE_PUNCT.sub("", text)
    text = _collapse_punctuation(text)
    text = _convert_chinese_numerals(text, segmenter)
    text = _convert_units(text)
    text = _en_numbers(text)
    return NormalText(_TRAILING_PUNCT.sub("", text))


def fold_space(text: str) -> str:
    """Whitespace runs as one space, nothing else touched: an answer as the user saw it is matched
    to a stored one by its words, whatever line breaks and indents a client kept of it."""
    return " ".join(text.split())


# Volatile parts of system-prompt templates; each pattern's match becomes its placeholder.
_VOLATILE: Final[tuple[tuple[re.Pattern[str], str], ...]] = (
    (re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"), "<email>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I), "<uuid>"),
    (
        re.compile(
            r"((?:current |logged[- ]in )?(?:user(?:name)?|name|customer|客户|当前用户|用户名?|姓名|称呼)"
            r"\s*[:=：]\s*)[^\s,.;，。；]+(?: [a-z][\w'-]*)?",
            re.I,
        ),
        r"\1<name>",
    ),
    (
        re.compile(r"((?:session|request|trace|order|conversation|chat)[ _-]?id\s*[:=：]\s*)\S+", re.I),
        r"\1<id>",
    ),
    (
        re.compile(
            r"\b\d{4}[-/.]\d{1,2}[-/.]\d{1,2}(?:[t ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:z|[+-]\d{2}:?\d{2})?)?\b", re.I
        ),
        "<date>",
    ),
    (re.compile(r"(?:\d{2,4}年)?\d{1,2}月\d{1,2}[日号](?:\s*(?:星期|周)[一二三四五六日天1-7])?"), "<date>"),
    (
        re.compile(
            r"\b(?:(?:mon|tues|wednes|thurs|fri|satur|sun)day,? )?(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|"
            r"nov|dec)[a-z]*\.? \d{1,2}(?:st|nd|rd|th)?(?:,? \d{4})?\b|\b\d{1,2} (?:jan|feb|mar|apr|may|jun|"
            r"jul|aug|sep|oct|nov|dec)[a-z]* \d{4}\b",
            re.I,
        ),
        "<date>",
    ),
    (re.compile(r"\b(?:mon|tues|wednes|thurs|fri|satur|sun)day\b|(?:星期|周)[一二三四五六日天]", re.I), "<weekday>"),
    (
        re.compile(r"\b\d{1,2}:\d{2}(?::\d{2})?(?:\s?[ap]\.?m\.?)?\b|(?:上午|下午|晚上)?\d{1,2}[点时]\d{0,2}分?", re.I),
        "<time>",
    ),
    (re.compile(r"\b(?=[a-z0-9_-]*\d)(?=[a-z0-9_-]*[a-z])[a-z0-9_-]{12,}\b", re.I), "<id>"),
    (re.compile(r"\d{6,}"), "<num>"),
)


def mask_volatile(text: str) -> str:
    """Replace the parts of a system prompt that change per request (dates, ids, user names...)."""
    for pattern, placeholder in _VOLATILE:
        text = pattern.sub(placeholder, text)
    return text


def system_prompt_version(system: NormalText) -> str:
    """A stable version of a system-prompt template: sha256 of its masked, normalised text."""
    masked = mask_volatile(system)
    return hashlib.sha256(masked.encode("utf-8")).hexdigest()[:16]
