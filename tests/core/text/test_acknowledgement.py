"""proxy/core/text/acknowledgement.py: a turn that only acknowledges the reply ("great", "Got it,
thanks!", "嗯", "好的，谢谢") asks nothing; a turn that asks anything besides is not one."""

from __future__ import annotations

import pytest

from proxy.core.text.acknowledgement import is_acknowledgement

ACKNOWLEDGEMENTS = [
    "great",
    "Great!",
    "cool",
    "nice",
    "good",
    "ok",
    "OK.",
    "okay thanks",
    "Got it, thanks!",
    "thanks",
    "Thank you so much!",
    "thx",
    "I see.",
    "That makes sense, thanks",
    "perfect, thank you",
    "sounds good",
    "that's great",
    "awesome 👍",
    "👍",
    "嗯",
    "嗯嗯",
    "好的",
    "好的，谢谢",
    "知道了",
    "明白了，谢谢！",
    "对",
    "好",
    "很好",
    "收到",
    "谢谢",
    "ｏｋ",  # full width: NFKC first
]

NOT_ACKNOWLEDGEMENTS = [
    "",
    "   ",
    "Great, what is the capital of France?",
    "Thanks, and what about Spain?",
    "good morning",
    "nice to meet you",
    "ok, now write it in Python",
    "great, make it shorter",
    "好的，再推荐一个",
    "嗯，写一首关于秋天的短诗",
    "yes",  # answers a question the reply asked: what follows depends on it
    "no",
    "really?",
    "why?",
    "thanks for what?",
    "How do I say thank you in Japanese?",
    "对吗",
    "谢谢用日语怎么说",
    "cool story, now tell me another",
]


@pytest.mark.parametrize("text", ACKNOWLEDGEMENTS)
def test_acknowledgements(text: str) -> None:
    assert is_acknowledgement(text)


@pytest.mark.parametrize("text", NOT_ACKNOWLEDGEMENTS)
def test_turns_that_ask_something(text: str) -> None:
    assert not is_acknowledgement(text)
