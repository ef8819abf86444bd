"""proxy/core/text/lexical.py: the reordered-words guard (the same words in another order are often
another question, which an embedding cannot tell from a paraphrase) and restatements (a turn spelled
out again is the same request)."""

from __future__ import annotations

import pytest

from proxy.core.text.lexical import (
    asks_nothing,
    numbers_reordered,
    reordered,
    restates,
    spans_swapped,
    stands_alone,
    statements,
    tokens,
    transposed,
    works_on_the_reply,
)
from proxy.core.text.normalize import normalize_text


def _reordered(a: str, b: str) -> bool:
    return reordered(normalize_text(a), normalize_text(b))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("北京到成都的火车票", "成都到北京的火车票"),
        ("东部北方邦和西部哈雅纳省", "西部北方邦和东部哈雅纳省"),
        # a long sentence where one exchange moves 3 % of the word pairs: under the discordance test's bar
        (
            "这种植物多生长在北部的高山草甸和南部的河谷平原，是当地居民常用的一种药材，也常见于各地的集市。",
            "这种植物多生长在南部的高山草甸和北部的河谷平原，是当地居民常用的一种药材，也常见于各地的集市。",
        ),
        (
            "Is a flight from Paris to Rome cheaper than the train?",
            "Is a flight from Rome to Paris cheaper than the train?",
        ),
        ("dogs chase cats in the garden every morning", "cats chase dogs in the garden every morning"),
    ],
)
def test_exchanged_words_are_reordered(a: str, b: str) -> None:
    assert _reordered(a, b)
    assert _reordered(b, a)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("北京到成都的火车票", "北京到成都的火车票多少钱"),
        ("How do I reset my password?", "how do i reset my password"),
        ("推荐一款轻薄本", "推荐一款轻薄笔记本"),
        ("What is the capital of France?", "Which city is the capital of France?"),
    ],
)
def test_same_order_or_other_words_are_not(a: str, b: str) -> None:
    assert not _reordered(a, b)


def test_transposed_needs_exactly_one_exchange() -> None:
    assert transposed(["a", "b", "c", "d"], ["c", "b", "a", "d"])
    assert not transposed(["a", "b", "c", "d"], ["a", "b", "c", "d"])
    assert not transposed(["a", "b", "c", "d"], ["b", "c", "a", "d"])  # a rotation, not an exchange
    assert not transposed(["a", "b", "c"], ["a", "b", "c", "d"])
    assert not transposed(["a", "b", "c", "d"], ["a", "x", "c", "y"])
    assert tokens(normalize_text("北京到成都的火车票"))[0] == "北京"


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("自17世纪初至12世纪,凯塔王朝统治马里", "自12世纪至17世纪初,凯塔王朝统治马里", True),
        ("flights from 3 to 5 pm", "flights from 5 to 3 pm", True),
        ("book 2 rooms for 3 nights", "book 2 rooms for 3 nights please", False),
        ("2 apples and 2 pears", "2 pears and 2 apples", False),  # the numbers themselves kept their order
        ("3 days in rome", "rome for 3 days", False),  # one number: nothing to turn around
        ("from 3 to 5", "from 3 to 6", False),
    ],
)
def test_numbers_in_another_order_are_reordered(a: str, b: str, expected: bool) -> None:
    assert numbers_reordered(a, b) is expected
    if expected:  # the reordered-words guard reads it
        assert reordered(a, b)


def test_two_names_exchanged_across_word_boundaries_are_reordered() -> None:
    # jieba cuts "惠特兰后" as one word on one side and "惠特兰" "后" on the other, and splits the
    # longer name in three: no word list shows the exchange, the characters do
    a = normalize_text("大选中击败马尔科姆·弗雷泽后，惠特兰授予他爵士头衔，表彰他的贡献。")
    b = normalize_text("大选中击败惠特兰后，马尔科姆·弗雷泽授予他爵士头衔，表彰他的贡献。")
    assert not transposed(tokens(a), tokens(b))
    assert spans_swapped(a, b) and spans_swapped(b, a)
    assert reordered(a, b)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("我欠他钱", "他欠我钱", True),  # one character each side is enough in Chinese
        ("Fraser beat Whitlam in 1975", "Whitlam beat Fraser in 1975", True),
        ("what is teh weather", "what is the weather", False),  # one Latin letter traded: a typo
        ("百度贴吧怎么设置头像", "百度贴吧头像怎么设置", False),  # a rotation, no middle: the same question
        ("a, b", "b, a", False),  # no two letters in a span
        ("北京到成都", "北京到成都", False),
        ("北京到成都", "北京到重庆", False),
    ],
)
def test_spans_swapped(a: str, b: str, expected: bool) -> None:
    assert spans_swapped(a, b) is expected


# Restatements (restates): a spelled-out question right after its elliptical version is the same
# request; anything new makes it another. What a reply states (statements) and whether a turn names
# anything (names_in) feed it.
OSLO = ["how cold will it get in Oslo", "Tomorrow Oslo drops to -8C at night."]
PHARMACY = ["find me the closest pharmacy", "The closest pharmacy is Greenleaf at 12 Birch Road."]


@pytest.mark.parametrize(
    ("previous", "current", "context", "expected"),
    [
        # the elliptical turn, spelled out with words of the earlier user turn
        ("Tomorrow.", "How cold will it get in Oslo tomorrow?", OSLO, True),
        (
            "Friday at 9am.",
            "Book the dentist appointment for Friday at 9am.",
            ["I need to book a dentist appointment"],
            True,
        ),
        # pointers replaced by what the stated reply named
        (
            "How long does it take to get there?",
            "How long does it take to get to Greenleaf pharmacy at 12 Birch Road?",
            PHARMACY,
            True,
        ),
        (
            "明天上午。",
            "帮我查一下明天上午去上海的高铁",
            ["帮我查一下去上海的高铁", "明天上午有G101次，8点出发。"],
            True,
        ),
        # something new: another city, a negation, another time
        ("Tomorrow.", "How cold will it get in Bergen tomorrow?", OSLO, False),
        ("Tomorrow.", "How cold will it not get in Oslo tomorrow?", OSLO, False),
        (
            "明天上午。",
            "帮我查一下明天下午去上海的高铁",
            ["帮我查一下去上海的高铁", "明天上午有G101次，8点出发。"],
            False,
        ),
        # words only an offer held: the user may not have taken it
        (
            "What about Chinese?",
            "What about Chinese food in the north part of town?",
            [
                "I want Italian food in the south part of town",
                statements("None in the south. Would you like the north?"),
            ],
            False,
        ),
        # the previous turn stood on its own: a longer question narrows it
        (
            "What is the best way to learn the Rust programming language quickly",
            "What is the best way to learn the Rust programming language quickly for work",
            ["I use Rust at work"],
            False,
        ),
        # the previous turn's own words dropped, or nothing added: not a restatement
        ("Tomorrow.", "How cold will it get in Oslo?", OSLO, False),
        ("Tomorrow.", "tomorrow", OSLO, False),
    ],
)
def test_restates(previous: str, current: str, context: list[str], expected: bool) -> None:
    assert restates(previous, current, context) is expected


def test_pointers_and_attaching_words_are_not_what_a_restatement_adds() -> None:
    context = [statements("Wagamama is a Japanese restaurant in the centre.")]
    assert restates("Yes, what is their phone number?", "Yes, what is the phone number of Wagamama?", context)
    assert restates("I don't care.", "I don't care about the price range.", ["any price range is fine"])
    # the same turn again adds nothing: a repeat, judged as one, not a restatement
    assert not restates("What is their phone number?", "what is their phone number", context)


def test_statements_keep_what_a_reply_states_and_drop_its_offers() -> None:
    text = "There is none in the south. Would you like the north? It opens at 9. 要不要换成北边？好的。"
    assert statements(text) == "There is none in the south. It opens at 9. 好的。"


@pytest.mark.parametrize(
    ("question", "settles"),
    [
        # which value a slot takes: the slot's words, no value
        ("What type of food would you like?", True),
        ("What area would you like?", True),
        ("How many people will be dining?", True),
        ("您想吃什么菜？", True),
        ("请问您几点出发？", True),
        # a value or a choice offered, which the user may not have taken
        ("How about Sala Thong?", False),
        ("What about the north part of town?", False),
        ("What do you think of the Italian place?", False),
        ("What kind of food, Italian or Indian?", False),
        ("Which do you prefer, Curry Prince?", False),
        ("What time, 7pm?", False),
        ("Would you like their phone number?", False),
        ("川菜还是粤菜？", False),
        ("你觉得全聚德怎么样？", False),
        ("要不要换成北边？", False),
    ],
)
def test_a_question_for_a_slot_settles_its_words_and_an_offer_does_not(question: str, settles: bool) -> None:
    reply = f"There are nine restaurants in the south. {question}"
    assert statements(reply) == (reply if settles else "There are nine restaurants in the south.")


def test_a_short_answer_to_a_question_for_a_slot_is_restated_with_the_slot() -> None:
    """ "I don't care." answers "What kind of food would you like?"; naming the slot says no more. A
    value the question never offered is still news."""
    context = ["I need a restaurant in the south part of town", statements("What kind of food would you like?")]
    assert restates("I don't care.", "I don't care about what kind of food.", context)
    assert not restates("I don't care.", "I don't care about what kind of Thai food.", context)
    offered = ["I need a restaurant in the south part of town", statements("How about Thai food?")]
    assert not restates("I don't care.", "I don't care about Thai food.", offered)


# An acknowledgement asks nothing (asks_nothing): nothing restates it, whichever of its words a
# later turn keeps, as framing ("Great, what is …?" after "great") or by chance (the 好 of "今天天气很
# 好" after "好的"). Every short turn users answer a reply with, in both languages, before a factual
# question, a translation and a writing request asked again.
ACKNOWLEDGEMENTS = ["great", "cool", "nice", "really?", "good", "Got it, thanks!", "很好", "嗯", "对", "好的", "知道了"]
FRANCE = "What is the capital of France?"
TRANSLATE = "请把这句话翻译成英文：今天天气很好。"
ASKED_AGAIN = [
    (FRANCE, "{ack}, what is the capital of France?"),
    ("Translate 'good morning' into French", "{ack}, translate 'good morning' into French"),
    ("Write a short poem about the sea", "{ack}, write a short poem about the sea"),
    (TRANSLATE, TRANSLATE),  # byte for byte
    (TRANSLATE, "请把这句话翻译成英文:今天天气很好."),  # half-width punctuation
    ("中国的首都是哪里？", "{ack}，中国的首都是哪里？"),
    ("写一首关于秋天的短诗", "{ack}，写一首关于秋天的短诗"),
]


@pytest.mark.parametrize("ack", ACKNOWLEDGEMENTS)
@pytest.mark.parametrize(("asked", "again"), ASKED_AGAIN)
def test_an_acknowledgement_is_never_restated(ack: str, asked: str, again: str) -> None:
    current = again.format(ack=ack.rstrip("!?."))
    assert asks_nothing(ack)
    assert not restates(ack, current, [asked, statements(f"Answer to: {asked}")])


@pytest.mark.parametrize(
    ("turn", "nothing"),
    [
        ("Yes, please.", True),  # pointers alone
        ("Sounds good, thank you so much!", True),
        ("嗯，知道了，谢谢", True),
        ("Five days.", False),
        ("I don't care.", False),
        ("May I have the phone number?", False),
        ("What about Chinese?", False),
        ("明天上午。", False),
    ],
)
def test_asks_nothing_is_true_of_acknowledgements_and_pointers_alone(turn: str, nothing: bool) -> None:
    assert asks_nothing(turn) is nothing


def test_a_turn_said_again_before_another_request_is_not_worked_into_it() -> None:
    """Whatever the acknowledgement (one no word list names), a turn that opens with it said again
    as a clause of its own asks what follows, where its words must recur. The price: a slot's
    value said first ("San Mateo, what will …?") is judged by similarity, not as a restatement."""
    assert not asks_nothing("Splendid!")
    assert not restates("Splendid!", "Splendid, what is the capital of France?", [FRANCE])
    assert restates("Tomorrow.", "Tomorrow. How cold will it get in Oslo tomorrow?", OSLO)
    weather = ["what will the temperature be next week?"]
    assert restates("San Mateo.", "What will the temperature be next week in San Mateo?", weather)
    assert not restates("San Mateo.", "San Mateo, what will the temperature be next week?", weather)


def test_an_earlier_question_asked_again_restates_nothing() -> None:
    """A turn whose words an earlier user turn all holds asks that turn again, whatever it keeps of
    the turn just before it by chance."""
    sunny = "Translate into French: five days of sun"
    assert restates("Five days.", sunny, [sunny])  # by the words alone
    assert not restates("Five days.", sunny, [sunny], earlier=[sunny])
    ski = "I need a packing list for a ski trip"
    restated = "I need a packing list for a five day ski trip"
    assert restates("Five days.", restated, [ski, statements("How many days will you stay?")], earlier=[ski])


@pytest.mark.parametrize(
    ("text", "on_reply"),
    [
        ("Can you give me an example?", True),
        ("simpler please", True),
        ("总结成一句话", True),
        ("能多讲一些吗", True),
        ("太长了，说重点", True),
        ("too long, get to the point", True),
        ("What is the capital of France?", False),
        ("这个景点的门票是多少", False),
    ],
)
def test_a_turn_that_works_on_the_last_reply_is_told_from_a_question_of_its_own(text: str, on_reply: bool) -> None:
    assert works_on_the_reply(text) is on_reply


@pytest.mark.parametrize(
    ("text", "alone"),
    [
        ("说一个关于蜜蜂的冷知识", True),  # short, yet names all it asks
        ("Why do we yawn?", True),
        ("Tell me a joke about pirates.", True),
        ("能举个具体的例子吗", False),  # works on the last reply
        ("太长了，说重点", False),
        ("can you make that shorter?", False),
        ("What about Paris?", False),  # a follow-up's opening
        ("那家酒店的早餐怎么样", False),  # points at the context
        ("Is it far?", False),
        ("好无聊", False),  # too few to name anything
        ("买的空气炸锅到手30天了，不想要了可以退吗", True),  # 可以 within a question is its own word
        ("可以，那就订这家吧谢谢你", False),  # ...opening a turn, a reply to the last one
    ],
)
def test_stands_alone(text: str, alone: bool) -> None:
    assert stands_alone(text) is alone
