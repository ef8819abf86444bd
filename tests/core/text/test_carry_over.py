"""The never-cache intent a conversation carries over to its later turns: one table of
conversations (user turns only, oldest first) and what the last turn is."""

from __future__ import annotations

import pytest

from proxy.core.text.carry_over import carried, read_turn
from proxy.core.text.never_cache import MEDICAL, REALTIME

WEATHER_EN = "What's the weather in Chicago today?"
WEATHER_ZH = "北京今天天气怎么样"
HEADACHE = "I have a headache and nausea."

CONVERSATIONS: list[tuple[list[str], str | None]] = [
    # medical holds for the rest of the conversation it governs
    ([HEADACHE, "How long will it last?"], MEDICAL),
    ([HEADACHE, "How long will it last?", "Should I call in sick tomorrow?"], MEDICAL),
    ([HEADACHE, "Can I still go to the gym?"], MEDICAL),
    ([HEADACHE, "Thanks!", "What if it comes back?"], MEDICAL),  # a courtesy does not end it
    (["我头疼还有点恶心", "要多久才能好"], MEDICAL),
    (["孩子拉肚子一天拉了五次", "能喝牛奶吗", "要吃蒙脱石散吗"], MEDICAL),
    (["I'm on lisinopril for blood pressure.", "OK", "What about Tylenol?"], MEDICAL),
    # ... until a turn clearly leaves it
    ([HEADACHE, "Did Cary Grant win any awards?"], None),
    ([HEADACHE, "OK thanks. Can you recommend a good mystery novel?"], None),
    ([HEADACHE, "Did Cary Grant win any awards?", "How tall was he?"], None),
    (["我最近老是失眠", "好的谢谢，推荐几本小说吧"], None),
    (["医生给我开了阿莫西林", "换个话题，给我推荐一部科幻电影"], None),
    ([HEADACHE, "Thanks!"], None),  # a courtesy is never medical itself
    ([HEADACHE, "Okay, thank you."], None),  # "thank you" whole, not "thank" and a "you" left over
    ([HEADACHE, "Thank you so much!"], None),
    # realtime holds only for the turns that lean on it
    ([WEATHER_EN, "And tomorrow?"], REALTIME),
    ([WEATHER_EN, "And tomorrow?", "What about Milwaukee?"], REALTIME),
    ([WEATHER_EN, "Is that normal for this time of year?"], REALTIME),
    (["What's the traffic like on I-405 right now?", "Should I take the 110 instead?"], REALTIME),
    ([WEATHER_ZH, "那上海呢"], REALTIME),
    ([WEATHER_ZH, "那上海呢", "明天呢"], REALTIME),
    (["茅台今天股价多少", "为什么跌了"], REALTIME),
    # ... and not for a question of its own, short or long
    ([WEATHER_EN, "Did Cary Grant win any awards?"], None),
    ([WEATHER_EN, "Where did Tyson Chandler grow up?"], None),
    ([WEATHER_ZH, "C语言会吗"], None),
    (["深圳这周末会下雨吗", "星座怎么算"], None),
    (["深圳这周末会下雨吗", "星座怎么算", "那我是10月5号出生的呢"], None),  # leans on a turn that is not realtime
    (["Is the Eiffel Tower open today?", "How tall is it?"], None),  # a settled fact, pointing back or not
    (["Is it snowing in Denver?", "How do snowflakes form?"], None),
    (["Who won the election in Argentina?", "What are his main policies?"], None),
    (["Who's in the Champions League final this year?", "How many times has Real Madrid won it?"], None),
    (["Is the Fender Squier in stock at Guitar Center?", "What strings does it come with?"], None),
    (["京东上这个型号现在多少钱", "这个牌子的售后怎么样"], None),  # a warranty stays
    (["京沪高铁今天有没有晚点", "高铁最快能开多快"], None),  # so does a top speed
    (["现在去机场打车要多久", "机场快线几点停运"], None),  # and a timetable
    (["去广州的航班现在还能改签吗", "改签要手续费吗"], None),  # and a fee
    (["长沙今天热不热", "长沙为什么叫火炉"], None),  # and a name
    (["我最近一吃芒果就起疙瘩", "以前都没事"], MEDICAL),
    (["京沪高铁今天有没有晚点", "G2次呢"], REALTIME),  # while a short turn leaning on it is live
    (["Is Zion crowded this weekend?", "What's the best trail for beginners there?"], None),  # a recommendation
    (["Write a poem about a fisherman caught in a storm.", "Make it shorter."], None),  # the weather of a poem
    ([WEATHER_EN, "Thanks!"], None),
    # text handed over is the user's material, not a question
    (["帮我把这句话翻译成英文:今天天气很好."], None),
    (["帮我把这句话翻译成英文:今天天气很好.", "再翻译成日文"], None),
    (['Translate into French: "It\'s raining today, take an umbrella."', "Now into Spanish."], None),
    # ... but a symptom in it is still someone's body, and carries like any medical turn
    (["翻译成英文：我这两天嗓子疼，还发烧。", "换成更口语的说法"], MEDICAL),
    # the turn's own rule first
    ([HEADACHE, "What's the weather in Paris today?"], REALTIME),
    ([WEATHER_EN, "I have a sore throat and a runny nose"], MEDICAL),
    ([], None),
]


@pytest.mark.parametrize(("turns", "intent"), CONVERSATIONS)
def test_the_last_turn_of_a_conversation_gets_what_the_rule_carries_to_it(turns: list[str], intent: str | None) -> None:
    found = carried([read_turn(t) for t in turns])
    assert (found.intent if found else None) == intent, found


def test_a_carried_match_says_so_and_names_the_rule_that_set_it() -> None:
    found = carried([read_turn(HEADACHE), read_turn("How long will it last?")])
    direct = carried([read_turn(HEADACHE)])
    assert found is not None and direct is not None
    assert found.carried and not direct.carried and found.rule == direct.rule


@pytest.mark.parametrize(
    ("text", "leans", "settled_fact", "leaves_medical", "courtesy"),
    [
        ("And tomorrow?", True, False, False, False),
        ("那上海呢", True, False, False, False),
        ("Which channel?", True, False, False, False),
        ("Did Cary Grant win any awards?", False, False, True, False),
        ("C语言会吗", False, False, True, False),
        ("星座怎么算", False, True, True, False),
        ("How tall is it?", True, True, False, False),
        ("What is a migraine?", False, True, False, False),  # names a body's trouble: stays on the topic
        ("What are alternatives?", True, True, False, False),  # a definition, and elliptical
        ("Thanks, I'll book an appointment.", False, False, False, True),
        ("谢谢", False, False, False, True),
        ("好吃吗", True, False, False, False),  # 好 is thanks only on its own
        ("Translate to German: good morning", False, False, True, False),
    ],
)
def test_what_a_turn_says_for_the_carry_over(
    text: str, leans: bool, settled_fact: bool, leaves_medical: bool, courtesy: bool
) -> None:
    r = read_turn(text)
    assert (r.leans, r.settled_fact, r.leaves_medical, r.courtesy) == (leans, settled_fact, leaves_medical, courtesy)
