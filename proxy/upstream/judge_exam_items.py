"""The judge's exam questions: each a request, a cached answer and the right verdict, in English
and Chinese. Near-misses are most of it (reset against delete, another country, one number changed,
the other direction), because a false yes is what serves a wrong answer. Hand-written pairs and
pairs built from small tables (capitals, sums, conversions), interleaved yes and no so a judge at
chance fails within a few questions."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import zip_longest

__all__ = ["ExamItem", "exam_items"]


@dataclass(frozen=True, slots=True)
class ExamItem:
    question: str
    answer: str
    expect: bool


_HAND_YES: tuple[tuple[str, str], ...] = (
    (
        "How do I reset my password?",
        "Open Settings > Account > Reset password, then follow the link we e-mail you.",
    ),
    (
        "I forgot my password, how can I get a new one?",
        "Open Settings > Account > Reset password, then follow the link we e-mail you.",
    ),
    ("Which city is France's capital?", "The capital of France is Paris."),
    ("How many days are there in a leap year?", "A leap year has 366 days."),
    ("Translate 'good morning' into French.", "Bonjour."),
    ("怎么修改绑定的手机号？", "在“设置 > 账号安全 > 手机号”里点“更换”，按提示验证新号码即可。"),
    ("绑定的手机号要怎么换？", "在“设置 > 账号安全 > 手机号”里点“更换”，按提示验证新号码即可。"),
    ("北京到上海的高铁大概要多久？", "北京到上海的高铁最快约4小时18分，一般在4.5到6小时之间。"),
    ("一年有几个季度？", "一年有四个季度。"),
    ("退货运费谁承担？", "质量问题的退货运费由商家承担，非质量问题由买家承担。"),
    (
        "Can you recommend a cheap Italian restaurant in the city centre?",
        "Pizza Hut City Centre is a cheap Italian place in the centre.",
    ),
)


_HAND_NO: tuple[tuple[str, str], ...] = (
    (
        "How do I delete my account?",
        "Open Settings > Account > Reset password, then follow the link we e-mail you.",
    ),
    ("How many days are there in a normal year?", "A leap year has 366 days."),
    ("What is the capital of Germany?", "The capital of France is Paris."),
    ("Translate 'good night' into French.", "Bonjour."),
    (
        "How long is the train from Shanghai to Beijing, and what does a first-class ticket cost?",
        "Beijing to Shanghai by high-speed train takes about 4.5 hours.",
    ),
    ("怎么注销账号？", "在“设置 > 账号安全 > 手机号”里点“更换”，按提示验证新号码即可。"),
    ("上海到北京的机票多少钱？", "北京到上海的高铁最快约4小时18分，一般在4.5到6小时之间。"),
    ("一年有几个月？", "一年有四个季度。"),
    ("换货运费谁承担？要几天到？", "质量问题的退货运费由商家承担，非质量问题由买家承担。"),
    (
        "Can you recommend an expensive Chinese restaurant in the north of the city?",
        "Pizza Hut City Centre is a cheap Italian place in the centre.",
    ),
    ("What is 15% of 80?", "15% of 60 is 9."),
    ("预算8000元，推荐一台笔记本电脑", "预算5000元的话，推荐联想小新Pro 14。"),
)


# (English name, Chinese name, capital, capital in Chinese)
_CAPITALS: tuple[tuple[str, str, str, str], ...] = (
    ("France", "法国", "Paris", "巴黎"),
    ("Germany", "德国", "Berlin", "柏林"),
    ("Japan", "日本", "Tokyo", "东京"),
    ("Italy", "意大利", "Rome", "罗马"),
    ("Spain", "西班牙", "Madrid", "马德里"),
    ("Egypt", "埃及", "Cairo", "开罗"),
    ("Canada", "加拿大", "Ottawa", "渥太华"),
    ("Australia", "澳大利亚", "Canberra", "堪培拉"),
    ("Brazil", "巴西", "Brasília", "巴西利亚"),
    ("Kenya", "肯尼亚", "Nairobi", "内罗毕"),
    ("Norway", "挪威", "Oslo", "奥斯陆"),
    ("Peru", "秘鲁", "Lima", "利马"),
)
# (a, b) for sums, and (kilometres) for conversions
_SUMS: tuple[tuple[int, int], ...] = ((17, 25), (48, 36), (123, 77), (9, 14), (250, 175), (64, 29), (305, 95), (12, 88))
_KM: tuple[int, ...] = (3, 5, 8, 12, 20, 42)


def _built() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    yes: list[tuple[str, str]] = []
    no: list[tuple[str, str]] = []
    for i, (en, zh, cap, cap_zh) in enumerate(_CAPITALS):
        other_en, other_zh, _, _ = _CAPITALS[(i + 5) % len(_CAPITALS)]
        answer_en, answer_zh = f"The capital of {en} is {cap}.", f"{zh}的首都是{cap_zh}。"
        yes.append((f"What is the capital of {en}?", answer_en))
        yes.append((f"{zh}的首都是哪个城市？", answer_zh))
        no.append((f"What is the capital of {other_en}?", answer_en))
        no.append((f"{other_zh}的首都是哪里？", answer_zh))
        no.append((f"What is the population of {cap}?", answer_en))
    for a, b in _SUMS:
        yes.append((f"What is {a} plus {b}?", f"{a} + {b} = {a + b}."))
        no.append((f"What is {a} plus {b + 10}?", f"{a} + {b} = {a + b}."))
        no.append((f"{a}减{b}等于多少？", f"{a}加{b}等于{a + b}。"))
    for km in _KM:
        metres = km * 1000
        yes.append((f"How many metres are in {km} kilometres?", f"{km} km is {metres:,} metres."))
        no.append((f"How many metres are in {km + 1} kilometres?", f"{km} km is {metres:,} metres."))
        no.append((f"{km}英里是多少公里？", f"{km}公里等于{metres}米。"))
    return yes, no


def exam_items() -> tuple[ExamItem, ...]:
    built_yes, built_no = _built()
    yes = [ExamItem(q, a, True) for q, a in (*_HAND_YES, *built_yes)]
    no = [ExamItem(q, a, False) for q, a in (*_HAND_NO, *built_no)]
    # two near-misses to each right answer, in turn
    halves = [no[0::2], no[1::2]]
    out: list[ExamItem] = []
    for y, n1, n2 in zip_longest(yes, *halves):
        out.extend(item for item in (n1, y, n2) if item is not None)
    return tuple(out)
