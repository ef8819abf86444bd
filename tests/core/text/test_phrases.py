"""proxy/core/text/phrases.py: keyword intents, reset phrases and corrections, each a table of texts in
both languages with the near misses that must not match."""

from __future__ import annotations

import pytest

from proxy.core.text.normalize import normalize_text
from proxy.core.text.phrases import KeywordRules, is_correction, is_reset_phrase

KEYWORDS = {
    "realtime": ["天气", "股价", "汇率", "现在", "today", "now", "latest"],
    "medical": ["症状", "用药", "诊断", "dose"],
}


@pytest.mark.parametrize(
    ("text", "intent"),
    [
        pytest.param("明天杭州天气怎么样", "realtime", id="zh-weather"),
        pytest.param("What is the latest news?", "realtime", id="en-latest"),
        pytest.param("Is the store open NOW?", "realtime", id="en-case"),
        pytest.param("布洛芬的用药剂量", "medical", id="zh-medicine"),
        pytest.param("What dose of ibuprofen is safe?", "medical", id="en-dose"),
        pytest.param("I know how to cook rice", None, id="know-is-not-now"),
        pytest.param("The doses of humour were large", None, id="dose-word-boundary"),
        pytest.param("帮我写一封请假邮件", None, id="none"),
    ],
)
def test_keyword_intent(text: str, intent: str | None) -> None:
    assert KeywordRules(KEYWORDS).intent(normalize_text(text)) == intent


def test_keyword_intent_follows_mapping_order() -> None:
    assert KeywordRules(KEYWORDS).intent(normalize_text("现在有什么症状")) == "realtime"
    assert KeywordRules(dict(reversed(list(KEYWORDS.items())))).intent(normalize_text("现在有什么症状")) == "medical"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("重新开始", True, id="zh-restart"),
        pytest.param("忘了之前的吧", True, id="zh-forget"),
        pytest.param("好吧，我们重新开始吧", True, id="zh-filler"),
        pytest.param("清空上下文", True, id="zh-clear"),
        pytest.param("start over", True, id="en-start-over"),
        pytest.param("Let's start over.", True, id="en-lets"),
        pytest.param("Forget everything I said", True, id="en-forget"),
        pytest.param("如何重新开始生活", False, id="zh-question-about-restarting"),
        pytest.param("重新开始游戏的方法", False, id="zh-game"),
        pytest.param("how do I start over after a layoff", False, id="en-question"),
        pytest.param("杭州有什么好玩的", False, id="unrelated"),
    ],
)
def test_is_reset_phrase(text: str, expected: bool) -> None:
    assert is_reset_phrase(normalize_text(text)) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("不对", True, id="zh-wrong"),
        pytest.param("不对，我要的是苏州", True, id="zh-wrong-then-fix"),
        pytest.param("不是这个意思", True, id="zh-not-what-i-meant"),
        pytest.param("你理解错了", True, id="zh-misunderstood"),
        pytest.param("你说的不对", True, id="zh-you-said-wrong"),
        pytest.param("答案不对吧", True, id="zh-answer-wrong"),
        pytest.param("That's not what I asked", True, id="en-not-asked"),
        pytest.param("wrong", True, id="en-wrong"),
        pytest.param("No, that is incorrect.", True, id="en-incorrect"),
        pytest.param("You misunderstood me", True, id="en-misunderstood"),
        pytest.param("这不对称吗", False, id="zh-symmetric"),
        pytest.param("感觉有点不对劲", False, id="zh-feels-off"),
        pytest.param("我写错了代码怎么办", False, id="zh-own-mistake"),
        pytest.param("What's wrong with my code?", False, id="en-whats-wrong-with"),
        pytest.param("what went wrong in the 2008 crisis", False, id="en-went-wrong"),
        pytest.param("谢谢，很有帮助", False, id="thanks"),
    ],
)
def test_is_correction(text: str, expected: bool) -> None:
    assert is_correction(normalize_text(text)) is expected
