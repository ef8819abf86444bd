from __future__ import annotations

import pytest

from proxy.core.text.never_cache import MEDICAL, REALTIME, fold, never_cache_match

NEVER_CACHED = [
    ("What is the bitcoin price?", REALTIME),
    ("How much is one euro in dollars right now?", REALTIME),
    ("Did Apple stock go up today?", REALTIME),
    ("What's the USD to JPY exchange rate?", REALTIME),
    ("Will it rain in Seattle tomorrow?", REALTIME),
    ("Is it gonna be dry in Carson on Sunday?", REALTIME),
    ("Who won the game last night?", REALTIME),
    ("Is Manchester United winning?", REALTIME),
    ("Is flight UA857 on time?", REALTIME),
    ("What are the latest headlines?", REALTIME),
    ("比特币现在多少钱", REALTIME),
    ("美元兑人民币是多少", REALTIME),
    ("茅台股价多少", REALTIME),
    ("明天上海会下雨吗", REALTIME),
    ("今晚国足比赛比分多少", REALTIME),
    ("这款手机还有货吗", REALTIME),
    ("实时路况怎么样", REALTIME),
    ("I have a headache and nausea, what could it be?", MEDICAL),
    ("How much ibuprofen can I take in a day?", MEDICAL),
    ("Can I drink alcohol while on antibiotics?", MEDICAL),
    ("What are the symptoms of strep throat?", MEDICAL),
    ("My blood test shows high white blood cell count", MEDICAL),
    ("Could this lump in my neck be cancer?", MEDICAL),
    ("我最近老是头疼还恶心，是什么原因", MEDICAL),
    ("布洛芬一天最多能吃几片", MEDICAL),
    ("体检报告里转氨酶偏高说明什么", MEDICAL),
    ("膝盖疼是怎么回事", MEDICAL),
    ("今天头疼", MEDICAL),  # a body before a day: either way never cached
    ("翻译成英文：我这两天嗓子疼，还发烧。", MEDICAL),  # a symptom handed over is still someone's body
    ("Please translate to German: 'I have had a sore throat and fever since Monday.'", MEDICAL),
    ("My 4-year-old has a fever of 102 and won't eat.", MEDICAL),
    ("My daughter got stung by a bee and her hand is puffy.", MEDICAL),
    ("I'm pregnant and have a cold. Can I take DayQuil?", MEDICAL),
    ("我手被开水烫了，起了水泡", MEDICAL),
    ("How many yen would I get for 500 dollars?", REALTIME),
    ("Who's leading the Masters?", REALTIME),
    ("西安明天多少度", REALTIME),
    ("演唱会门票还能买到吗", REALTIME),
    # a task's wording does not hide a live question after it
    ("What's on my calendar today, and is it raining now?", REALTIME),
    ("Write me the latest bitcoin price", REALTIME),
    ("Act as a doctor: I have had a fever and a cough for three days.", MEDICAL),  # the asker's own body
    ("你现在是一名医生，我头疼得厉害怎么办", MEDICAL),
    # a date counted from today, the present of a state, transit status, a market price
    ("Did the Lakers win last night?", REALTIME),
    ("Has the verdict come out yet?", REALTIME),
    ("is the new iPhone out yet", REALTIME),
    ("It's raining today, what should we do in Paris?", REALTIME),  # a moment: the weather is asked too
    ("今天下雨天适合去哪玩", REALTIME),
    ("今晚去外面吃，推荐一家现在还营业的餐馆", REALTIME),  # what holds that day is asked
    ("今天到北京，有没有还有空房的酒店", REALTIME),
    ("What do used bikes sell for these days?", REALTIME),
    ("Are the trains to Leeds running on time?", REALTIME),
    ("Is the Bay Bridge closed because of the accident?", REALTIME),
    ("How much is a used Corolla going for?", REALTIME),
    ("苹果最近多少钱一斤", REALTIME),
    ("昨天的比赛谁赢了", REALTIME),
    ("青岛这两天海边浪大不大", REALTIME),
    ("ＢＩＴＣＯＩＮ  price", REALTIME),  # full width and spacing fold away
    # what to do next, of a place or on a day the clock names: still what is on now
    ("What should I do now in Paris?", REALTIME),
    ("I missed my flight today, what should I do now?", REALTIME),
    ("现在做什么好玩", REALTIME),
    ("What is happening now in Gaza?", REALTIME),
]

CACHEABLE = [
    "How do prices work in economics?",
    "What is an exchange rate?",
    "什么是汇率",
    "At what temperature does water boil?",
    "Where do penguins live?",
    "Why is the sky blue?",
    "Do I have to pay tax on savings?",
    "I know the answer already",  # "now" inside "know"
    "Take the train to Paris",  # "rain" inside "train"
    "Give me a lump sum payment plan",
    "当前目录下的文件怎么列出来",
    "明天上午的会我不去了，帮我写一封请假邮件",
    "现在你是一名机器学习工程师，解释一下什么是语言模型",
    "帮我写一篇新闻稿",
    "这段演讲很有感染力",
    "股票和基金有什么区别",
    "帮我把这句话翻译成英文:今天天气很好.",  # the weather of a text to translate
    'Translate into French: "It\'s raining today, take an umbrella."',
    "《今日说法》是什么节目",
    "Now into Spanish.",  # "now" opening an instruction
    "What's the weather like in Kyoto in November?",  # a season's weather
    "台风是怎么形成的",  # how weather works
    "新闻联播是哪一年开播的",
    "Given the following records of stock prices, extract the highest close per month:\n2022-01-03,150.2",
    "想象你正在参加比赛。如果你刚刚超过了第二名，你现在的位置是什么？",  # the present of an imagined scene
    # a task whose time words say when to do it or what to write about
    "Can you schedule a meeting with the design team at 4pm later this week?",
    "Remind me to call my mother tonight",
    "Put the dentist's birthday party into my calendar for this weekend",
    "Help me write a catchy headline for an article on the latest Mars rover findings",
    "请帮我写一个关于最新人工智能进展的文章标题",
    "Write a limerick about a dog who hates the snow",  # the weather of a poem
    "Act as a doctor and propose new treatments for chronic diseases, weighing each patient's age.",
    "把自己想象成一名医生，为各种疾病提出创新的治疗方法。",  # a role set up, not the asker's body
    # weather as the premise of what to do, not a question of what it is
    "what should i do at home on a rainy Sunday? so bored",
    "Any ideas for a snowy afternoon with two kids?",
    "下雨天可以做些什么打发时间",
    "下雨天无聊死了，给点建议",
    # "yet" in an instruction to the model, not a state asked after
    "ask me a hard riddle and don't tell me the answer yet",
    # the day the asker goes out, in a request for a place to eat or stay
    "你好，我与朋友定好今晚到外面吃，有没有人均消费在100-150元之间，评分在4分以上的餐馆推荐一下呢？",
    "今天外地的朋友过来，有没有评分4.5分以上的经济型酒店给我找一个？",
    # the asker's next step in their own situation: "now" is where the conversation stands (issue 46.6)
    "What should I do now?",
    "My order arrived broken, what should I do now?",
    "So what do I do now?",
    "Now what?",
    "What are my options now?",
    "我现在该怎么办？",
    "那现在怎么办",
    "快递到了发现是坏的，我们现在应该怎么处理",
    "",
]


@pytest.mark.parametrize(("text", "intent"), NEVER_CACHED)
def test_never_cached_requests_are_recognised(text: str, intent: str) -> None:
    found = never_cache_match(text)
    assert found is not None and found.intent == intent, found


@pytest.mark.parametrize("text", CACHEABLE)
def test_ordinary_questions_on_the_same_topics_stay_cacheable(text: str) -> None:
    assert never_cache_match(text) is None


def test_fold_lowercases_widths_and_spacing() -> None:
    assert fold("  ＡＢＣ\t Now ") == "abc now"
