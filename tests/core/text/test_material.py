from __future__ import annotations

import pytest

from proxy.core.text.material import asked_words

ASKED = [
    ("What's the weather in Paris?", "what's the weather in paris?"),
    ("帮我把这句话翻译成英文:今天天气很好.", ""),  # instruction, colon, material
    ('Translate into French: "It\'s raining today."', ""),
    ("Summarize this for my manager:\nWeather delays pushed today's shipment.", ""),
    ("把“今日头条”翻译成英文", ""),  # quoted material
    ("翻译一下今天天气很好", ""),  # material with nothing round it
    ("今天天气很好用英语怎么说", ""),
    ("translate good morning into french", ""),
    ("It is raining today. Translate to French.", ""),  # the instruction after its material
    ("Given the following records of stock prices, extract the highest close\n2022-01,150", ""),
    ("《今日说法》是什么节目", " 是什么节目"),  # a title is material; the question is the user's
    ('What does "breaking news" mean?', ""),
    ("总结一下今天的新闻", "总结一下今天的新闻"),  # no material handed over: a question about today
    ("Now into Spanish.", "now into spanish."),
    ("It's raining, isn't it?", "it's raining, isn't it?"),  # apostrophes are not quotes
    ("", ""),
]


@pytest.mark.parametrize(("text", "asked"), ASKED)
def test_the_users_own_words_leave_out_the_material_they_hand_over(text: str, asked: str) -> None:
    assert asked_words(text) == asked
