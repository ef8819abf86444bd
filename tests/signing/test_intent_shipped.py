"""The shipped policy's intents as the default pack reads them (issue 46.6): everyday questions are not
the shop's, and a question of what to do next is not realtime. The real model, the real policy."""

from __future__ import annotations

from collections.abc import Sequence

import orjson
import pytest

from proxy.core.openai.request import parse_chat_request
from proxy.service.compose import Parts

SHOP = ("refund", "after_sales", "logistics", "customer_support")


async def intent_of(parts: Parts, turns: Sequence[str]) -> str:
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    sig = await parts.signer.sign(parse_chat_request(orjson.dumps({"model": "m", "messages": msgs})))
    return sig.tags.intent


# the nearest exemplar of a how-to with no shop in it was a shop intent's, phrased as a how-to too
# ("How long does a refund take…"), at a similarity no higher than a shop question's own
@pytest.mark.parametrize(
    "text",
    [
        "How long should I boil an egg for a hard yolk?",
        "How long should I rest a steak after grilling?",
        "How do I remove rust from a cast iron pan?",
        "How long does paint take to dry between coats?",
        "煮鸡蛋要煮多久才能全熟？",
        "下水道堵了怎么疏通",
        "油漆多久能干透",
        "米饭在冰箱里能放几天",  # 几天 was a travel keyword
    ],
)
async def test_an_everyday_question_is_general_not_the_shops(parts: Parts, text: str) -> None:
    assert await intent_of(parts, [text]) == "general"


@pytest.mark.parametrize(
    "text",
    ["How long does it take to get my money back after a return?", "退款一般几天能到账", "过了质保期还能修吗"],
)
async def test_a_shop_question_is_still_the_shops(parts: Parts, text: str) -> None:
    assert await intent_of(parts, [text]) in SHOP


# "now" here is the point the conversation has reached, not the clock's: the answer does not go stale
@pytest.mark.parametrize(
    "turns",
    [
        ["My order arrived broken.", "I'm sorry to hear that.", "What should I do now?"],
        ["The package came damaged and the screen is cracked.", "Sorry about that!", "So what do I do now?"],
        ["我的订单到了发现是坏的", "很抱歉。", "我现在该怎么办？"],
        ["收到的杯子是碎的", "很抱歉给您带来不便。", "那现在怎么办"],
    ],
)
async def test_what_to_do_now_after_a_shop_problem_stays_with_the_shop(parts: Parts, turns: list[str]) -> None:
    opening = await intent_of(parts, turns[:1])
    assert opening in SHOP
    assert await intent_of(parts, turns) == opening


@pytest.mark.parametrize(
    "turns",
    [
        ["What should I do now in Paris?"],
        ["What is the bitcoin price?", "67,000 dollars.", "What about now?"],
        ["北京现在天气怎么样"],
    ],
)
async def test_now_that_asks_the_clock_is_still_realtime(parts: Parts, turns: list[str]) -> None:
    assert await intent_of(parts, turns) == "realtime"


# one request whose wordings fall either side of a boundary the exemplars draw: one unsure, and so
# general, the other a shop question (issue 47: the first was filtered:intent against the second).
# Each may be served the other's record: one intent, or neighbours (benchmarks/bench_filters.py)
@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("I forgot my password, how can I reset it?", "How do I reset my password?"),
        ("密码忘了怎么办", "怎么重置登录密码"),
    ],
)
async def test_two_wordings_of_one_request_read_by_one_intent_or_neighbours(parts: Parts, one: str, other: str) -> None:
    read, written = await intent_of(parts, [one]), await intent_of(parts, [other])
    assert read == written or written in parts.policy_box.policy.for_intent(read).neighbours
