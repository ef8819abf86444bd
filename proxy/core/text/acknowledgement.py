"""A turn that only acknowledges the reply: "great", "Got it, thanks!", "I see.", "嗯", "好的，谢谢".

It asks nothing of its own, so what the assistant says next ("You're welcome!", or going on with
what it offered) is the conversation's, not the turn's: no other conversation's answer fits it,
and its own answer fits no other turn. It is not a topic switch either: nothing new is asked.

A turn is an acknowledgement when it is made of acknowledgement phrases alone, with punctuation,
spaces, emoji and Chinese modal particles between them. One word besides makes it a request
("Great, what is the capital of France?", "好的，再推荐一个", "thanks for what?"). "yes" and "no"
are left out: they answer a question the reply asked, and "really?" asks one.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

__all__ = ["is_acknowledgement"]

# an adjective said of the reply, bare ("great") or as a sentence ("that's really helpful")
_ADJECTIVES: Final = (
    "great|good|cool|nice|fine|perfect|awesome|excellent|wonderful|amazing|lovely|neat|helpful|"
    "brilliant|fantastic|super|sweet|good to know|very helpful"
)
_SAID_OF_IT: Final = (
    rf"(?:(?:that'?s|that is|this is|it'?s|thats)\s+)?(?:(?:so|very|really|super)\s+)?(?:{_ADJECTIVES})"
)
_ENGLISH: Final = (
    "ok|okay|okey|k|kk|alright|all right|got it|gotcha|i see|i understand|understood|noted|"
    "(?:that )?makes sense|sounds (?:good|great)|fair enough|"
    "thanks?(?: you)?(?: (?:so|very) much| a lot| again)?|thank u|many thanks|much appreciated|"
    "(?:i )?appreciate it|cheers|thx|ty|tysm|(?:that|this) help(?:s|ed)|"
    rf"{_SAID_OF_IT}"
)
_CHINESE: Final = (
    "嗯嗯|嗯|恩|哦|噢|喔|好的|好滴|好吧|好嘞|好|行吧|行|可以|对的|对对|对|没错|"
    "我?知道了|我?明白了|明白|我?懂了|了解了?|收到|"
    "谢谢[你您]?|谢啦|多谢|非常感谢|感谢|太好了|很好|挺好|不错|真棒|太棒了|棒|厉害|原来如此|辛苦了"
)
_EMOJI: Final = "👍|🙏|👌|😊|🙂|😀|😄|❤️|❤"
# an ASCII phrase ends at a word's end ("good" is not "goodbye"); a Chinese one anywhere
_PHRASE: Final = re.compile(rf"(?:(?:{_ENGLISH})(?![a-z0-9'])|{_CHINESE}|{_EMOJI})")
# between phrases: punctuation, spaces, and particles that only colour them (好的呀, 对啊, 嗯呢)
_BETWEEN: Final = re.compile(r"^[\s,.!?;:~\-—…、，。！？；：～呀啊哈啦呢嘛]+")


def is_acknowledgement(text: str) -> bool:
    """``text`` is acknowledgement phrases alone (at least one), whatever separates them."""
    rest = unicodedata.normalize("NFKC", text).lower().replace("’", "'")
    matched = False
    while rest := _BETWEEN.sub("", rest, count=1):
        phrase = _PHRASE.match(rest)
        if phrase is None:
            return False
        rest, matched = rest[phrase.end() :], True
    return matched
