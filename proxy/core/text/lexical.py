"""Lexical guards for the decision: what embeddings cannot see.

- *Reordered words*: "A's father is B" and "B's father is A" embed almost identically (PAWS-X
  pairs score AUC ~0.54 on every model we ship). When two questions share most words but in
  another order, the cache cannot tell a paraphrase from a role swap, so it must not serve.
- *Context-dependent turns*: "Yes, please." or "what about their address?" mean what the last
  assistant message makes them mean; such a turn may reuse an answer only if that message is
  (nearly) the same.
- *Restatements*: "San Mateo." after "what will the temperature be next week?", then "What will
  the temperature be next week in San Mateo?" asks the elliptical turn again, spelled out. Its
  question vector is far from "San Mateo." though the request is the same; the words show it.
  An acknowledgement ("great", "好的", "really?") asks nothing, so nothing restates it: a turn
  after it that asks an earlier question again is that question, not the acknowledgement.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from proxy.core.text.names import names_in
from proxy.core.text.normalize import Cutter, default_segmenter

_EN_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_CJK = re.compile(r"[\u3400-\u9fff]")


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


STOPWORDS = _words(
    "a an the is are was were be to of in on at for and or do does did i you me my your it its this that "
    "please can could would will what which who how why when where 的 了 吗 呢 吧 啊 是 我 你 请 一下"
)
_ANAPHORA_EN = _words(
    "it its that this these those they them their there he she his her him one ones yes no ok okay sure "
    "and also too else"
)
_ANAPHORA_ZH = (
    "它",
    "那个",
    "这个",
    "那家",
    "这家",
    "那些",
    "这些",
    "他们",
    "她们",
    "上面",
    "刚才",
    "前面",
    "好的",
    "可以",
    "是的",
    "不用",
    "还有",
    "那就",
    "那么",
)
# replies to the last turn where they open one ("可以，那就订这家"); within a question they are its
# own words ("不想要了可以退吗")
_REPLIES_ZH = frozenset(("好的", "可以", "是的", "不用"))
# Short turns name too little to stand alone ("景点的周边有哪些酒店啊？" means the attraction under
# discussion). 12 characters separate most CrossWOZ follow-ups; English turns of 4 words or fewer
# ("Yes, please.", "I don't care.") or with pronouns depend on the last reply.
SHORT_CJK_CHARS = 12
SHORT_EN_WORDS = 4
# the fewest a turn that stands alone has ("Why do we yawn?", "章鱼的冷知识")
STANDALONE_CJK_CHARS = 6
STANDALONE_EN_WORDS = 3
_FOLLOWUP_START = ("what about", "how about", "and ", "那", "还有", "再")


def words(text: str, segmenter: Cutter | None = None) -> list[str]:
    """Every word in order, lower-cased: jieba words for Chinese, words for the rest."""
    if _CJK.search(text):
        cut = (segmenter or default_segmenter()).words(text)
        return [w for w in (w.strip().lower() for w in cut) if w and w.isalnum()]
    return _EN_WORD.findall(text.lower())


def tokens(text: str, segmenter: Cutter | None = None) -> list[str]:
    """Content tokens in order: ``words`` less the stop words."""
    return [w for w in words(text, segmenter) if w not in STOPWORDS]


def _discordant_fraction(order_a: Sequence[int], order_b: Sequence[int]) -> float:
    pairs = discordant = 0
    for i in range(len(order_a)):
        for j in range(i + 1, len(order_a)):
            pairs += 1
            discordant += (order_a[i] - order_a[j]) * (order_b[i] - order_b[j]) < 0
    return discordant / pairs if pairs else 0.0


def transposed(ta: Sequence[str], tb: Sequence[str]) -> bool:
    """The same words with exactly two of them exchanged ("北京到成都" / "成都到北京", "east of A and
    west of B" / "west of A and east of B"): the pattern that turns a question into another one
    with the same words. In long sentences one exchange moves too few word pairs for the
    discordance test to see it."""
    if len(ta) != len(tb):
        return False
    diff = [i for i, (x, y) in enumerate(zip(ta, tb, strict=True)) if x != y]
    return len(diff) == 2 and ta[diff[0]] == tb[diff[1]] and ta[diff[1]] == tb[diff[0]]


# a swap of two spans is looked for in the part the texts do not share: past this many
# characters of it, the two texts differ by more than one exchange anyway
SWAP_MAX_CHARS = 160


def _span_counts(span: str) -> bool:
    """A span that can carry meaning: a Chinese character ("我欠他钱" / "他欠我钱"), or two letters
    or digits (one Latin letter traded is a typo: "teh" / "the")."""
    return bool(_CJK.search(span)) or sum(c.isalnum() for c in span) >= 2


def spans_swapped(a: str, b: str) -> bool:
    """The same text with two spans exchanged, wherever the word boundaries fall ("击败马尔科姆·弗雷泽后，
    惠特兰授予" / "击败惠特兰后，马尔科姆·弗雷泽授予": jieba cuts the two names differently on each side,
    so no word list shows the exchange)."""
    if a == b or len(a) != len(b):  # an exchange keeps the length
        return False
    start = 0
    while a[start] == b[start]:
        start += 1
    end = len(a)
    while a[end - 1] == b[end - 1]:
        end -= 1
    mid_a, mid_b = a[start:end], b[start:end]
    n = len(mid_a)
    if n > SWAP_MAX_CHARS:
        return False
    for i in range(1, n):
        first = mid_a[:i]
        if not mid_b.endswith(first):
            continue
        for j in range(i + 1, n):  # a middle between them: a rotation ("XY" / "YX") is often the same question
            second = mid_a[j:]
            if mid_b == second + mid_a[i:j] + first and _span_counts(first) and _span_counts(second):
                return True
    return False


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def numbers_reordered(a: str, b: str) -> bool:
    """The same numbers in another order ("from the 12th to the early 17th century" / "from the
    early 17th to the 12th"; "3 of 5" / "5 of 3"): a range or a ratio turned around."""
    na, nb = _NUMBER.findall(a), _NUMBER.findall(b)
    return len(na) >= 2 and na != nb and sorted(na) == sorted(nb)


def reordered(
    a: str,
    b: str,
    *,
    overlap: float = 0.6,
    swap: float = 0.05,
    segmenter: Cutter | None = None,
    loose: bool = True,
) -> bool:
    """True when the two texts are the same words with two of them exchanged, carry the same
    numbers in another order, or (``loose``) share most content words but not in the same order.
    The loose test also flags paraphrases that reorder ("reset my account password" / "reset the
    password of my account"): where a pair verifier reads word order, it judges those instead."""
    if numbers_reordered(a, b):
        return True
    ta, tb = tokens(a, segmenter), tokens(b, segmenter)
    if ta == tb or not ta or not tb:
        return False
    if transposed(ta, tb) or spans_swapped(a, b):
        return True
    if not loose:
        return False
    shared = [w for w in dict.fromkeys(ta) if w in tb]
    if len(shared) < 3 or len(shared) / max(len(set(ta)), len(set(tb))) < overlap:
        return False
    pos_a = [ta.index(w) for w in shared]
    pos_b = [tb.index(w) for w in shared]
    return _discordant_fraction(pos_a, pos_b) > swap


def context_dependent(text: str, segmenter: Cutter | None = None) -> bool:
    """Short, elliptical or anaphoric turns lean on the previous assistant message."""
    lowered = text.strip().lower()
    if lowered.startswith(_FOLLOWUP_START):
        return True
    if _CJK.search(lowered):
        if any(a in lowered for a in _ANAPHORA_ZH):
            return True
        return len(_CJK.findall(lowered)) <= SHORT_CJK_CHARS
    words = _EN_WORD.findall(lowered)
    return len(words) <= SHORT_EN_WORDS or any(w in _ANAPHORA_EN for w in words)


_SENTENCE = re.compile(r"[^.!?。！？]+[.!?。！？]*")
# A question that asks which value a slot takes ("What type of food would you like?", "您想去哪个区
# 域？") offers none: its words name the slot the user's short answer fills, so a restatement that
# names the slot says no more than that answer did. One that offers a value or a choice ("How about
# Curry Prince?", "Would you like the north?", "What do you think of the Italian place?", "Italian
# or Indian?", "要不要换成北边？", "川菜还是粤菜？") settles nothing: the user may not have taken it.
_SLOT_QUESTION_EN = re.compile(
    r"(?:and |so |ok,? |okay,? |great,? |sure,? )?(?:what|which|where|when|who|how)\b(?! about\b)"
)
_SLOT_QUESTION_ZH = re.compile(r"什么|哪|几|多少")
_CHOICE = re.compile(r"(?<![a-z])(?:or|think|sound|sounds)(?![a-z])|还是|或者|或是|要不要|要么|怎么样|如何|觉得")


def _asks_for_a_slot(question: str) -> bool:
    """``question``: one sentence of a reply, stripped, ending with a question mark."""
    if _CJK.search(question):
        return (
            bool(_SLOT_QUESTION_ZH.search(question)) and not _CHOICE.search(question) and not _NUMBER.search(question)
        )
    lowered = question.lower()
    # names_in: no capitalised name past the start, no number
    return bool(_SLOT_QUESTION_EN.match(lowered)) and not _CHOICE.search(lowered) and not names_in(question)


def statements(text: str) -> str:
    """What a reply settles: the sentences that state something, and the questions that ask which
    value a slot takes (the slot's words, not a value: see ``_asks_for_a_slot``). Its other
    questions ("Would you like the north part instead?") offer options the user may not have
    taken, so their words settle nothing. Read from the raw reply: normalised text has lost the
    closing question mark."""
    sentences = (s.strip() for s in _SENTENCE.findall(text))
    return " ".join(s for s in sentences if not s.endswith(("?", "？")) or _asks_for_a_slot(s))


def stem(word: str) -> str:
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def _token_set(text: str, segmenter: Cutter | None) -> set[str]:
    return {stem(w) for w in tokens(text, segmenter)}


# Words a restatement uses to attach what the elliptical turn pointed at ("the phone number *of*
# Curry Prince", "I don't care *about* the area", "the gas station *called* Valero"): no content
# of their own, so they need not be found in the conversation.
_ATTACHING_EN = _words("about with from by called named located")


# Words that only take in what was said: receipts, reactions, thanks. A turn of nothing else
# ("great", "Got it, thanks!", "really?", "很好", "嗯", "知道了") asks nothing: no request of its own
# is left to spell out, and its words, kept in a later turn ("Great, what is …?", the 好 of "今天天气
# 很好"), are framing or coincidence, not what that turn asks.
_ACKNOWLEDGING = _words(
    "great cool nice good really got thanks thank thx ty fine right alright awesome perfect excellent "
    "wonderful lovely amazing interesting wow oh ah aha hmm hm huh uh um yeah yep yup nope nah gotcha "
    "understood noted see cheers sweet neat brilliant fantastic super true indeed exactly agreed sounds "
    "makes sense fair enough know so much very lot well done lol haha that's "
    "好 很 挺 非常 嗯 对 行 哦 噢 喔 哇 知道 明白 了解 清楚 懂 收到 不错 厉害 真棒 太棒了 太好了 好滴 那好 "
    "酷 赞 谢谢 感谢 多谢 没错 确实 真的 原来 原来如此 哈哈 呵呵 嘿嘿"
)


def asks_nothing(text: str, segmenter: Cutter | None = None) -> bool:
    """Is the turn only an acknowledgement or pointers ("great", "Yes, please.", "好的", "嗯，知道了"):
    no content word of its own that a later turn could spell out?"""
    return all(_pointer(w) or w in _ACKNOWLEDGING for w in tokens(text, segmenter))


_END_MARKS = re.compile(r"[\s,，、:：;；.。!！?？~～…]+$")
_CLAUSE_MARK = re.compile(r"\s*[,，、:：;；.。!！?？~～…]")


def _worked_in(previous: str, current: str, segmenter: Cutter | None) -> list[str]:
    """The words of ``current`` that can spell ``previous`` out: all of them, unless ``current``
    opens with the whole previous turn said again as a clause of its own ("Awesome, what is the
    capital of France?" after "Awesome!"). That opening is the turn repeated, then another request
    (often one asked before): only what follows it counts, so whatever the acknowledgement, its
    words must recur there. Read from the words the turn was cut into once."""
    words = tokens(current, segmenter)
    said = _END_MARKS.sub("", previous.strip().lower())
    lowered = current.strip().lower()
    if said and lowered.startswith(said) and _CLAUSE_MARK.match(lowered, len(said)):
        opening = tokens(previous, segmenter)
        if words[: len(opening)] == opening:
            return words[len(opening) :]
    return words


def spelled_out(
    previous: str, current: str, segmenter: Cutter | None = None, *, names_nothing: bool = False
) -> set[str]:
    """The words ``current`` adds to the ``previous`` turn while keeping every content word of it;
    empty when it is no such spelling-out (then no context need be read). ``previous`` must lean
    on the conversation: elliptical or anaphoric (``context_dependent``), or, per the caller's
    ``names_nothing``, naming no place, product, person or number of its own ("Can you pick a
    quick route for me?": to where?); and it must ask something (``asks_nothing``: not an
    acknowledgement). Pointers ("there", "their", "yes", "它") are dropped from both sides: a
    restatement replaces them with what they point to, or keeps them."""
    if asks_nothing(previous, segmenter) or not (names_nothing or context_dependent(previous, segmenter)):
        return set()
    before = {w for w in _token_set(previous, segmenter) if not _pointer(w)}
    now = {stem(w) for w in _worked_in(previous, current, segmenter) if not _pointer(stem(w))}
    return {w for w in now - before if w not in _ATTACHING_EN} if before and before <= now else set()


def asked_before(current: str, earlier: Sequence[str], segmenter: Cutter | None = None) -> bool:
    """Does one of the ``earlier`` user turns hold every content word of ``current``? Then
    ``current`` asks that turn again, whatever it shares with the turn just before it: after
    "好的", "请把这句话翻译成英文：今天天气很好。" keeps the 好 by chance, not by spelling it out."""
    now = {w for w in _token_set(current, segmenter) if not _pointer(w)}
    return bool(now) and any(now <= _token_set(text, segmenter) for text in earlier)


# a turn that works on the last reply rather than asking anything of its own: asked again right
# after its answer, it asks for another ("Give me an example", "总结成一句话")
_ON_THE_REPLY = re.compile(
    r"\b(?:examples?|another|more|shorter|simpler|longer|again|rephrase|summari[sz]e|expand|elaborate|"
    r"in other words|one sentence|different|too long|to the point|tl;?dr)\b"
    r"|例子|举个例|换一个|换个|再来|再说|多讲|详细|简单|简短|总结|概括|一句话|换种说法|太长|说重点|精简"
)


def works_on_the_reply(text: str) -> bool:
    """Does the turn ask for something done to the last reply (another example, a shorter one)?"""
    return bool(_ON_THE_REPLY.search(text.lower()))


def stands_alone(text: str) -> bool:
    """Does the turn name what it asks about, so that it asks the same after any other turns?
    Looser than not ``context_dependent`` for Chinese, whose short questions often name everything
    ("说一个关于蜜蜂的冷知识"): only a pointer to the context, a follow-up's opening, work on the
    last reply or a turn of a few words leans on what came before."""
    lowered = text.strip().lower()
    if lowered.startswith(_FOLLOWUP_START) or works_on_the_reply(lowered):
        return False
    if _CJK.search(lowered):
        return len(_CJK.findall(lowered)) >= STANDALONE_CJK_CHARS and not any(
            a in lowered and (a not in _REPLIES_ZH or lowered.startswith(a)) for a in _ANAPHORA_ZH
        )
    words = _EN_WORD.findall(lowered)
    return len(words) >= STANDALONE_EN_WORDS and not any(w in _ANAPHORA_EN for w in words)


def _pointer(word: str) -> bool:
    return word in _ANAPHORA_EN or word in _ANAPHORA_ZH


def all_known(words: set[str], context: Sequence[str], segmenter: Cutter | None = None) -> bool:
    known: set[str] = set()
    for text in context:
        known |= _token_set(text, segmenter)
    lowered = [t.lower() for t in context]
    return all(w in known or _in_chinese_text(w, lowered) for w in words)


def restates(
    previous: str,
    current: str,
    context: Sequence[str],
    segmenter: Cutter | None = None,
    *,
    names_nothing: bool = False,
    earlier: Sequence[str] = (),
) -> bool:
    """``current`` spells out the ``previous`` turn that leaned on the conversation (see
    ``spelled_out``): it keeps every content word of it and adds only words the conversation
    already holds (``context``: earlier user turns and the stated facts of the replies around
    ``previous``). Anything new (another city, a negation, "instead") makes it another request;
    so does asking one of the ``earlier`` user turns again (``asked_before``)."""
    added = spelled_out(previous, current, segmenter, names_nothing=names_nothing)
    return bool(added) and not asked_before(current, earlier, segmenter) and all_known(added, context, segmenter)


_NEGATION_ZH = ("不", "没", "别", "无", "非", "未", "勿", "莫")


def _in_chinese_text(word: str, texts: Sequence[str]) -> bool:
    """Chinese words are matched inside the text: jieba cuts "查一下去上海" and "查一下明天去上海"
    differently, and the word is there all the same. A negation is never taken as known."""
    return bool(_CJK.search(word)) and not any(n in word for n in _NEGATION_ZH) and any(word in t for t in texts)


def _trigrams(text: str) -> set[str]:
    t = re.sub(r"\s+", " ", text.strip().lower())
    return {t[i : i + 3] for i in range(max(1, len(t) - 2))}


def text_similarity(a: str, b: str) -> float:
    """Character-trigram Jaccard: 1.0 for the same message, low for a different one."""
    if not a and not b:
        return 1.0
    ga, gb = _trigrams(a), _trigrams(b)
    return len(ga & gb) / len(ga | gb) if ga | gb else 0.0


# Whole turns that are only a courtesy formula mean the same whatever their wording; embeddings
# put 谢谢 and 非常感谢 at 0.96, below any safe threshold, so they are named once here.
_FORMULAS = {
    "谢谢": (
        "谢谢",
        "谢谢你",
        "谢谢您",
        "非常感谢",
        "多谢",
        "感谢",
        "太感谢了",
        "谢谢啦",
        "万分感谢",
        "感谢你",
        "感谢您",
        "thanks",
        "thank you",
        "thanks a lot",
        "thank you very much",
        "thanks so much",
        "many thanks",
    ),
    "你好": ("你好", "您好", "嗨", "哈喽", "hello", "hi", "hey", "hi there", "hello there"),
    "再见": ("再见", "拜拜", "回头见", "bye", "goodbye", "good bye", "bye bye", "see you"),
}
_FORMULA_OF = {v: k for k, vs in _FORMULAS.items() for v in vs}
_TRIM = re.compile(r"[\s!！.。,，~～?？、]+")


def canonical_formula(text: str) -> str | None:
    """The canonical form of a turn that is nothing but a courtesy formula, else None."""
    return _FORMULA_OF.get(_TRIM.sub(" ", text.lower()).strip())
