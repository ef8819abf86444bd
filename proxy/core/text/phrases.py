"""Phrase rules read from normalised text: intent keywords, session resets, corrections, and
change instructions (negation, addition, modification of a constraint). Every rule takes a
``NormalText``: the request was normalised once, and the patterns are written for that form."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Final

from proxy.core.text.normalize import NormalText, normalize_text
from proxy.core.text.patterns import whole_words


def _keyword_pattern(keyword: str) -> tuple[str, re.Pattern[str]]:
    """Keywords come from the policy file: compiled once per keyword by the ``KeywordRules`` that
    holds them (no memo shared between policies or apps). With the pattern, the literal every match
    contains: a substring test rules out nearly every keyword before its regex runs."""
    keyword = normalize_text(keyword) if keyword.isascii() else keyword.lower()
    if re.search(r"[a-z0-9]", keyword) and keyword.isascii():
        return keyword, re.compile(whole_words(re.escape(keyword)))
    return keyword, re.compile(re.escape(keyword))


class KeywordRules:
    """A policy's intent keywords, each read into its literal and pattern once: a classifier asks
    them twice a request, and looking each keyword up again cost three times the scan."""

    def __init__(self, keywords: Mapping[str, Sequence[str]]) -> None:
        self._rules = [(intent, *_keyword_pattern(w)) for intent, words in keywords.items() for w in words if w.strip()]

    def intent(self, norm: NormalText) -> str | None:
        """The first intent (in mapping order) one of whose keywords occurs in ``norm``.

        English keywords match whole words only ("now" does not fire on "know"); Chinese ones match
        as substrings of the normalised text.
        """
        for intent, literal, pattern in self._rules:
            if literal in norm and pattern.search(norm):
                return intent
        return None


# A phrase counts only at the start of a clause, after filler words, so that
# "如何重新开始生活" or "how do I start over after a layoff" are questions, not resets.
_CLAUSE_START: Final = r"(?:^|[,.;!?:\n])\s?"
_ZH_FILLER: Final = r"(?:好吧|算了|那|那么|嗯|哎|唉|我们|咱们|请|让我们|你|还是|干脆|直接|先)*"
_EN_FILLER: Final = r"(?:(?:ok|okay|well|please|so|just|let's|let us|can we|could we|can you|you can|no|um|hmm),? ?)*"
_RESET: Final = re.compile(
    rf"{_CLAUSE_START}{_ZH_FILLER}(?:(?:重新开始|从头开始|从头来|重来)(?=$|[,.!?;]|吧|了|啊|呀|好吗|好不好|可以吗|哦)|忘了之前|忘掉之前|忘记之前|忘了前面|忘掉前面|"
    rf"忘记前面|忘了刚才|忘掉刚才|清空(?:上下文|对话|聊天记录|记录|历史)|开个新对话|开始新对话|之前的都不算)"
    rf"|{_CLAUSE_START}{_EN_FILLER}(?:start over|start again|start from scratch|restart the conversation|"
    rf"forget (?:everything|all (?:of )?that|what (?:i|we) said|the previous|our previous|our conversation)|"
    rf"reset (?:the |this |our )?(?:conversation|chat|context)|new conversation|clear (?:the )?(?:context|history))"
)
_CORRECTION: Final = re.compile(
    rf"{_CLAUSE_START}(?:不|嗯|呃|额|哎|唉|啊|可是|但是)?,?(?:不对(?![称劲付头路口等])|不是这个意思|不是这样的|"
    rf"不是我要的|这不是我(?:想)?要的|不是我想要的|我不是(?:这个意思|问这个|说这个|要这个)|我问的不是|错了(?!吗|么)|答非所问)"
    r"|你(?:说|讲|理解|搞|弄|算|答|写|回答|翻译|记)?错了|你(?:没|没有)(?:理解|明白|听懂|看懂)|你理解得不对"
    r"|(?:答案|回答|结果|你说的|你的回答|这个回答|这个答案)(?:是|完全|好像|似乎)?(?:不对|错的|错了|有误)"
    rf"|{_CLAUSE_START}(?:no,? )?(?:that'?s|that is|this is|it'?s|it is|you'?re|you are|you got it|all|"
    r"your answer is|the answer is)?\s?(?:wrong|incorrect|not right|not correct)(?! with| about)(?=[ ,.!?]|$)"
    r"|not what i (?:asked|meant|wanted|said|was asking)|you misunderstood|you misread|that'?s not it"
    r"|you (?:got|have) it wrong|i (?:didn'?t|did not) ask (?:for|about) (?:that|this)|that'?s not what i"
)


def is_reset_phrase(norm: NormalText) -> bool:
    """Does the user ask to drop the conversation so far ("重新开始", "start over")?"""
    return bool(_RESET.search(norm))


def is_correction(norm: NormalText) -> bool:
    """Does the user say the last answer was wrong ("不对", "你理解错了", "that's not what I asked")?"""
    return bool(_CORRECTION.search(norm))


# --- change instructions ----------------------------------------------------------------------
# Each rule names the kind of change its phrases make; matched against normalised text. Chinese
# phrases carry look-arounds for the everyday words that contain them (要不要, 不用谢, 特别, 区别).
_CHANGE_RULES: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    (
        "topic_switch",
        re.compile(
            r"换(?:个|一个)话题|聊(?:点|些)别的|说(?:点|些)别的|(?:另|另外)一个问题|别的问题|不(?:聊|说)这个了"
            r"|题外话|问个别的|说个别的|change the subject|change of (?:topic|subject)|new topic|another question"
            r"|(?:a )?different (?:topic|question)|unrelated (?:question|topic)|switching (?:topics|gears)"
            r"|on (?:a different|another) note|random question|off[- ]topic|something else entirely"
            r"|talk about something else"
        ),
    ),
    (
        "negation",
        re.compile(
            r"(?<!要)不要(?!紧|客气|担心|着急|急|谢)|(?<!用)不用(?!谢|客气|担心|着急|急)|不需要(?!谢)|不想要|取消|去掉|"
            r"删掉|删除|删了|排除|除去|拿掉|省掉|不含|不包括|不考虑|(?<!吃)不吃|(?<!喝)不喝|(?<!去)不去了?|(?<!住)不住"
            r"|(?<![特区类级告分个识性鉴辨差离派送道惜临话])别(?![人的处墅致名称针说扭再]|具一格)"
            r"|\b(?:don'?t|do not|dont)\b(?! (?:know|understand|think|mind|worry|get|care|remember|see|have to)\b)"
            r"|\b(?:remove|removing|without|exclude|excluding|drop|skip|cancel|avoid|except|no longer)\b"
            r"|leave out|get rid of|not include|no more"
            # "but no temples please", "no museums": a bare "no" before a noun excludes it
            r"|\b(?:but|and|with|,)\s+no\s+[a-z]{3,}|^no\s+(?!problem|thanks|thank|worries|idea|need)[a-z]{3,}s\b"
        ),
    ),
    (
        "addition",
        re.compile(
            r"加上|加个|加一|再加|多加|补充|还有|另外|增加(?!到)|添加|再来|再推荐|再给|再多|也要|也想|顺便|额外"
            r"|\b(?:also|add|adding|include|including|plus|additionally|another|extra)\b|as well|in addition"
            r"|\bmore (?:options|examples|ideas|details|choices|suggestions)\b"
        ),
    ),
    (
        "modification",
        re.compile(
            r"改成|改为|改到|改一下|改下|换成|换为|换到|换个|换一(?:个|家|款|种|下|批)|变成|调整|调到|提高|提升|增加到|"
            r"降到|降低|减少|减到|缩短|延长|推迟|提前到|放宽|而不是|其实|别的|其他的|其它的"
            r"|再[^\s,.!?]{1,3}(?:一点|一些|点|些)|更(?:轻|便宜|贵|快|慢|短|长|大|小|简单|详细|正式|近|远|安静|好)"
            r"|太(?:贵|重|远|长|短|多|少|难|简单|复杂|正式|大|小|满|累|赶|紧|挤|早|晚|辣|咸|油)了"
            r"|(?:轻松|便宜|实惠|简单|简短|通俗|详细|正式|口语化|清淡|安静|短|长|轻|快|慢|早|晚|近|少|多)(?:一点|一些)"
            r"|(?:^|[,.!?])(?:不|no|nope),|我(?:说|指)的是|换(?:个|一种)说法|用表格|列成表|列个表|如果换成|要是换成"
            r"|change (?:it |that |this |them )?to|switch (?:it )?to|\binstead\b|rather than|\b(?:increase|decrease|"
            r"reduce|raise|lower|cheaper|lighter|shorter|longer|bigger|smaller|faster|simpler|modify|update|swap|"
            r"replace|postpone|reschedule|rephrase|rewrite|reword|actually)\b|make it|move (?:it )?to"
            r"|\bmore (?:formal|casual|detailed|concise)\b|\bless (?:formal|expensive|detailed)\b"
            r"|too (?:expensive|heavy|long|short|far|much|many|formal|big|small)|(?:what|how) about|what if"
            r"|\b(?:restate|reformat|summarize it|shorten|expand)\b|in the form of"
            r"|(?:turn|convert) (?:it|that|this|your (?:answer|response)) into"
            r"|as a (?:table|list|bulleted list)|in (?:a table|bullet points|one sentence)"
            r"|i'?m talking about|i meant\b"
        ),
    ),
)


def change_signals(norm: NormalText) -> tuple[str, ...]:
    """The change phrases of one turn as ``kind:phrase`` ("negation:不要", "modification:instead")."""
    signals: list[str] = []
    for kind, pattern in _CHANGE_RULES:
        signals += [f"{kind}:{m.group().strip()}" for m in pattern.finditer(norm)]
    return tuple(dict.fromkeys(signals))


def change_instruction(norm: NormalText) -> bool:
    """The coarse tag: does this turn negate, add to or modify what was asked before?"""
    return any(not s.startswith("topic_switch:") for s in change_signals(norm))
