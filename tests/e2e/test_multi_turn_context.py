"""Multi-turn context cases, each its own row: the real signer (model, tagger, classifier, shipped policy)
and the pure decision over records built from real signatures."""

from __future__ import annotations

import dataclasses

import numpy as np
import orjson
import pytest

from proxy.core.decision.decide import decide
from proxy.core.decision.validate import extract_key_facts
from proxy.core.model import Candidate, Record, Signature, Status
from proxy.core.openai.request import parse_chat_request
from proxy.service.compose import Parts
from tests.factories import make_record


async def sign(parts: Parts, *turns: str) -> Signature:
    """Alternating user/assistant turns, ending with the user's."""
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return await parts.signer.sign(parse_chat_request(orjson.dumps({"model": "m", "messages": msgs})))


def record_of(sig: Signature, answer: str = "cached answer") -> Record:
    return make_record(
        cache_id="sc-test",
        context_fingerprint=sig.context_fingerprint,
        intent=sig.tags.intent,
        coarse_tags=sig.record_tags(),
        vector=np.asarray(sig.vector, dtype=np.float32).tobytes(),
        qvector=np.asarray(sig.question_vector, dtype=np.float32).tobytes(),
        answer_text=answer,
        system_prompt_version=sig.system_prompt_version,
    )


def candidate(cached: Signature, request: Signature) -> Candidate:
    return Candidate(
        record_of(cached),
        float(cached.vector @ request.vector),
        float(cached.question_vector @ request.question_vector),
    )


async def decide_pair(parts: Parts, cached: Signature, request: Signature) -> tuple[Status, str]:
    policy = parts.policy_box.policy.for_intent(request.tags.intent)
    d = decide([candidate(cached, request)], request, policy)
    return d.status, d.summary


HANGZHOU = ("周末去杭州玩三天，预算五千以内，帮我排一个行程", "第一天西湖，住西湖边的酒店。")
SUZHOU = ("周末去苏州玩三天，预算五千以内，帮我排一个行程", "第一天拙政园，住平江路的酒店。")


async def test_hotel_breakfast_follow_up_is_tied_to_its_city(parts: Parts) -> None:
    in_hangzhou = await sign(parts, *HANGZHOU, "那家酒店的早餐值不值得吃")
    in_suzhou = await sign(parts, *SUZHOU, "那家酒店的早餐值不值得吃")
    assert in_hangzhou.tags.entities.places == {"杭州"}
    assert in_suzhou.tags.entities.places == {"苏州"}
    assert await decide_pair(parts, in_hangzhou, in_suzhou) == (Status.MISS, "filtered:entities:places")


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("帮我写一封请假邮件", "帮我写一封投诉邮件"),
        ("客服电话为什么打不通", "退款申请多久能到账"),
        ("Write me an email asking for a day of leave", "Write me an email to complain about late delivery"),
    ],
)
async def test_close_embeddings_of_other_intents_never_hit(parts: Parts, first: str, second: str) -> None:
    a, b = await sign(parts, first), await sign(parts, second)
    assert a.tags.intent != b.tags.intent
    status, reason = await decide_pair(parts, a, b)
    assert (status, reason) == (Status.MISS, "filtered:intent")


async def test_budget_change_is_a_change_with_a_conflicting_entity(parts: Parts) -> None:
    before = await sign(parts, "推荐一款适合编程的轻薄本，预算八千以内")
    after = await sign(
        parts, "推荐一款适合编程的轻薄本，预算八千以内", "推荐 A 和 B 两款。", "预算提高到一万，重量再轻一点"
    )
    assert after.tags.change_instruction
    budgets = {n.value for n in after.tags.entities.numbers if n.slot == "budget"}
    assert budgets == {10000.0}
    status, reason = await decide_pair(parts, before, after)
    assert status is not Status.HIT
    assert reason == "filtered:entities:budget"


# five travel turns with their replies
HANGZHOU_TRIP = (
    "周末去杭州玩三天，帮我排一个行程",
    "第一天西湖。",
    "第二天去哪里",
    "第二天灵隐寺。",
    "酒店推荐哪家",
    "推荐西湖边的酒店。",
    "交通怎么安排",
    "地铁加打车。",
    "门票多少钱",
    "西湖免费，灵隐寺75元。",
)


async def test_topic_switch_after_five_travel_turns_starts_a_new_conversation(parts: Parts) -> None:
    travel = HANGZHOU_TRIP
    switched = await sign(parts, *travel, "明天的会议纪要帮我整理一下")
    assert switched.tags.context_switch
    assert "杭州" not in switched.view_text  # signed as the root of a new conversation
    staying = await sign(parts, *travel, "西湖边还有什么好玩的景点")
    assert not staying.tags.context_switch


@pytest.mark.parametrize(
    ("first", "second"),
    [("谢谢！", "谢谢!"), ("谢谢", "非常感谢"), ("你好，在吗？", "你好,在吗?")],
)
async def test_thanks_and_width_variants_still_hit(parts: Parts, first: str, second: str) -> None:
    a, b = await sign(parts, first), await sign(parts, second)
    assert (a.tags.intent, b.tags.intent) == ("chitchat", "chitchat")
    status, _ = await decide_pair(parts, a, b)
    assert status is Status.HIT


async def test_a_three_day_answer_fails_validation_for_a_five_day_request(parts: Parts) -> None:
    five = await sign(parts, "帮我规划一个杭州五天的行程")
    answer = "第一天：西湖。\n第二天：灵隐寺。\n第三天：千岛湖。"
    rec = dataclasses.replace(record_of(five, answer), key_facts=extract_key_facts(answer))
    policy = parts.policy_box.policy.for_intent(five.tags.intent)
    d = decide([Candidate(rec, 1.0, 1.0)], five, policy)
    assert (d.status, d.reason) == (Status.MISS, "validation_failed")
    good = "第一天：西湖。\n第二天：灵隐寺。\n第三天：千岛湖。\n第四天：乌镇。\n第五天：宋城。"
    rec = dataclasses.replace(record_of(five, good), key_facts=extract_key_facts(good))
    assert decide([Candidate(rec, 1.0, 1.0)], five, policy).status is Status.HIT
