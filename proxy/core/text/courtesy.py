"""A question's courtesy framing: "Quick question:", "please", "thanks", "请问", "麻烦问一下", "谢谢"
ask nothing, so a turn re-sent with them added or dropped (a user editing the message) asks what it
asked before. ``bare_question`` strips them, with the space and
punctuation at the ends, and nothing else: case, inner punctuation and every other word stay, so
two turns with the same bare question differ only in framing.

Only framing at the ends counts, and only where it cannot be what is asked about: a greeting needs
punctuation after it ("Hi, ...", "你好，..."), a closing "thanks" or "谢谢" punctuation before it,
so "How do I say thank you?" and "日语怎么说谢谢" keep their last words. A closing English "please"
may follow a word directly ("... is broken please"), except after a word that quotes it.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

__all__ = ["bare_question"]

_EDGE: Final = r"[\s,.!?;:~\-—、，。！？；：～…]*"
# framing that asks nothing whatever follows it
_LEAD_ANY: Final = (
    r"(?:(?:a )?quick question|one (?:more )?question|(?:just )?a question|question|excuse me|sorry|"
    r"please|pls|plz|kindly|"
    r"请问一下|请问下|请问|麻烦问一下|麻烦问下|麻烦请问|想问一下|想问下|问一下|打扰一下|打扰了|"
    r"请(?=帮|给|告诉|推荐|介绍|解释|说明|讲|列|写|问))"
)
# greetings: only with punctuation after them, as "hello world" and "你好用英语怎么说" ask about them
_LEAD_GREETING: Final = r"(?:hi|hello|hey|good (?:morning|afternoon|evening)|你好|您好|嗨|哈喽|在吗)"
_LEAD: Final = re.compile(
    rf"^(?:{_LEAD_ANY}(?:\b|(?<=[^\x00-\x7f]))|{_LEAD_GREETING}(?=[\s]*[,.!?;:~，。！？；：～…]))",
    re.IGNORECASE,
)
# closings: only after punctuation ("..., thanks", "...吗？谢谢")
_TAIL_AFTER_MARK: Final = re.compile(
    r"[,.!?;:~，。！？；：～…]\s*"
    r"(?:thanks?(?: you)?(?: (?:so|very) much| a lot| in advance)?|thx|ty|many thanks|cheers|please|pls|plz|"
    r"谢谢你?|谢谢啦|谢啦|多谢|感谢|麻烦了|麻烦你了|拜托了)$",
    re.IGNORECASE,
)
# a closing "please" straight after the request, unless the word before quotes it ("say please")
_TAIL_PLEASE: Final = re.compile(
    r"(?<!\bsay)(?<!\bsaid)(?<!\bspell)(?<!\bwrite)(?<!\btype)(?<!\bword)(?<!\btranslate)\s+(?:please|pls|plz)$",
    re.IGNORECASE,
)
_ENDS: Final = re.compile(rf"^{_EDGE}|{_EDGE}$")
_SPACE: Final = re.compile(r"\s+")


def bare_question(text: str) -> str:
    """``text`` without its courtesy framing and the punctuation at its ends, spaces folded, the
    first letter in lower case (sentence case is framing too). Empty when nothing else is left."""
    out = _SPACE.sub(" ", unicodedata.normalize("NFKC", text)).strip()
    while True:
        before = out
        out = _ENDS.sub("", out)
        out = _LEAD.sub("", out)
        out = _TAIL_AFTER_MARK.sub("", out)
        out = _TAIL_PLEASE.sub("", out)
        if out == before:
            break
    return out[:1].lower() + out[1:]
