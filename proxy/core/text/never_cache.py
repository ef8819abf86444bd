"""Rules that recognise requests whose answer must never come from a cache, in English and Chinese.

Two families, each a list of named patterns over the lowercased, width-folded text:

- ``realtime``: the answer changes with the clock. Prices and quotes of traded things (stocks,
  crypto, gold, oil, currencies), exchange rates, weather, scores and results, flight status,
  stock levels, news, and anything anchored to the present ("now", "today", "latest", 现在,
  今天, 最新, 实时).
- ``medical``: the answer depends on a person's body. Symptoms, dosages, drugs, diagnoses,
  test results (their table: ``proxy.core.text.medical_rules``).

They run before the exemplar classifier because a miss here is a wrong answer served to someone
else, while a false alarm only costs one upstream call. Recall is therefore the target
(benchmarks/bench_never_cache.py). Ordinary questions *about* the topics stay cacheable on
purpose: "how do prices work in economics", "what is an exchange rate", "why is the sky blue",
"how does the immune system work" name no asset, no present moment and no one's own body, so
their answers do not go stale or depend on the asker.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Final

from proxy.core.text.material import asked_words
from proxy.core.text.medical_rules import MEDICAL_RULES
from proxy.core.text.patterns import whole_words

REALTIME: Final = "realtime"
MEDICAL: Final = "medical"


@dataclass(frozen=True, slots=True)
class NeverCacheMatch:
    intent: str  # REALTIME or MEDICAL
    rule: str  # the name of the pattern that fired, for logs and the benchmark
    carried: bool = False  # carried over from an earlier turn (proxy/core/text/carry_over.py)


_ASSET_EN: Final = (
    r"bitcoin|btc|ethereum|eth|crypto(?:currency|currencies)?|dogecoin|doge|solana|xrp|litecoin|"
    r"stocks?|shares?|nasdaq|dow jones|dow|s&p(?: ?500)?|index funds?|ftse|nikkei|hang seng|index fund|etf|"
    r"gold|silver|oil|crude|brent|gas|gasoline|petrol|diesel"
)
_CURRENCY_EN: Final = (
    r"dollars?|usd|euros?|eur|yen|jpy|pounds?|gbp|sterling|yuan|rmb|renminbi|cny|won|rupees?|"
    r"francs?|chf|pesos?|baht|ringgit|hkd|sgd|aud|cad"
)
_WEATHER_EN: Final = (
    r"weather|forecast|rain(?:ing|y|fall)?|snow(?:ing|y|fall|storm)?|blizzard|sleet|"
    r"hail(?:ing)?|drizzl(?:e|ing)|mist(?:y)?|fog(?:gy)?|cloudy|overcast|sunny|humid(?:ity)?|windy|"
    r"thunderstorms?|storms?|tornado|hurricane|typhoon|heat ?wave|frost|clear skies|uv index|"
    r"air quality|aqi|pollen count|wind chill|dew point"
)
_PRESENT_EN: Final = (
    r"right now|now|today|today's|tonight|tonight's|this (?:morning|afternoon|evening|week|weekend)|"
    r"currently|at the moment|as of now|as we speak|latest|breaking|up to date|up-to-date|"
    r"live (?:scores?|stream|updates|coverage|results|prices?)|real[- ]time|this minute|so far today|"
    # a date counted from today, and the present of a state: anchored to now, so is the answer
    r"yesterday|yesterday's|last night|last night's|these days|nowadays|lately|at present|so far|yet"
)
_REALTIME_RULES: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    (
        "en_asset_price",
        re.compile(
            whole_words(_ASSET_EN)
            + r".{0,30}"
            + whole_words(
                r"prices?|quotes?|trading|worth|value|rates?|doing|go(?:ing|ne)? up|went up|"
                r"go(?:ing|ne)? down|went down|drop(?:ped)?|ris(?:e|ing)|fall(?:ing)?|"
                r"closed?|opened?|market cap|per (?:ounce|barrel|gallon|litre|liter)"
            )
            + "|"
            + whole_words(r"prices?|quotes?|value|worth|cost")
            + r" (?:of|for) (?:an? |one |1 |the )?"
            + whole_words(_ASSET_EN)
            + "|"
            + whole_words(r"how much is|how much are|how much does|what's|what is")
            + r" (?:an? |one |1 |the )?"
            + whole_words(_ASSET_EN)
            + r"(?: (?:at|worth|cost|trading at|going for|selling for))?\s*[?.!]?$"
            + "|"
            + whole_words(r"should i (?:buy|sell|hold|invest in|get out of)")
            + r" (?:[a-z]+ ){0,2}"
            + whole_words(_ASSET_EN)
        ),
    ),
    (
        "en_ticker",
        re.compile(
            r"(?<![a-z0-9])\$[a-z]{1,5}(?![a-z])|"
            + whole_words(
                r"ticker|share price|stock price|"
                r"stock quote|market cap"
            )
        ),
    ),
    (
        "en_currency",
        re.compile(
            r"(?<!an )"
            + whole_words(
                r"exchange rates?(?! (?:work|regimes?|polic(?:y|ies)|systems?|theory))|conversion rate|"
                r"forex|fx rate"
            )
            + "|"
            + whole_words(_CURRENCY_EN)
            + r"\s*(?:to|in|into|against|vs\.?|versus|per)\s*(?:[a-z]+ )?"
            + whole_words(_CURRENCY_EN)
            + "|"
            + whole_words(_CURRENCY_EN)
            + r".{0,25}"
            + whole_words(r"rates?|exchange")
            + "|"
            + whole_words(r"how much is|convert")
            + r" (?:an? |one |\d+ )?"
            + whole_words(_CURRENCY_EN)
            + "|"
            + whole_words(r"how many")
            + " "
            + whole_words(_CURRENCY_EN)
            + r".{0,30}"
            + whole_words(_CURRENCY_EN)
        ),
    ),
    (
        "en_weather",
        re.compile(
            whole_words(_WEATHER_EN)
            + "|"
            + whole_words(
                r"(?:highest|lowest|high|low) temperatures?|temperatures? (?:in|outside|"
                r"today|tonight|tomorrow|this|for the|be|will)|what(?:'s| is| will be) the "
                r"temperature(?! of)|how (?:hot|cold|warm) is it"
            )
            + "|"
            + whole_words(r"(?:is|will|was) it")
            + r"(?: (?:going to|gonna|supposed to))?(?: be)?"
            r"(?: [a-z]+)? " + whole_words(r"dry|hot|cold|warm|chilly|freezing|wet|rain|snow|pour|sunny|clear|cloudy")
        ),
    ),
    (
        "en_score",
        re.compile(
            r"(?:is|are) [a-z .]{2,40} winning|"
            + whole_words(
                r"who won|who is winning|who's winning|who(?:'s| is| are) playing|"
                r"who(?:'s| is) (?:leading|ahead|in the lead)|"
                r"who scored|final score|live score|the score|score of|"
                r"scores (?:today|tonight|last night|so far)|scoreline|"
                r"match result|game result|results? of the (?:game|match|race|election)|standings|leaderboard"
            )
        ),
    ),
    (
        "en_status",
        re.compile(
            whole_words(
                r"flight [a-z]{0,3}\d+|(?:flight|train|bus)[^.?!]{0,20}(?:delayed|on time|cancell?ed)|delays? at|"
                r"(?:trains?|flights?|bus(?:es)?|ferr(?:y|ies)|subway|metro|tube|trams?|roads?|bridges?|tunnels?|"
                r"highways?|airports?|passes)[^.?!]{0,30}(?:running|delayed|on time|cancell?ed|closed|suspended)|"
                r"going for|going rate|selling for|trading (?:at|for)|"
                r"in stock|out of stock|still available|sold out|open right now|still open|"
                r"(?:tickets?|seats?|rooms?|parking|spaces?|spots?|tables?) (?:left|still available)|"
                r"any (?:tickets|seats)|"
                r"(?:is|are) there (?:still )?(?:any )?(?:parking|tickets?|seats?|spaces?|spots?|rooms?|tables?)|"
                r"traffic (?:on|near|jam|like)|"
                r"headlines|breaking news|in the news|news (?:today|about|on|from)|any (?:news|updates)|latest updates|"
                r"what's new with|what(?:'s| is) (?:happening|going on) (?:with|in|at)|latest on"
            )
        ),
    ),
    (
        "en_present",
        re.compile(
            whole_words(_PRESENT_EN)
            + "|"
            + whole_words(r"current|recent|newest|this year's|upcoming")
            + r" (?:[a-z]+ )?"
            + whole_words(
                r"prices?|rates?|weather|temperature|score|status|value|news|events?|"
                r"president|prime minister|ceo|leader|champion|version|release|"
                r"record|ranking|interest rates?|inflation|situation|time|date"
            )
        ),
    ),
    (
        "zh_asset_price",
        re.compile(
            r"(?:比特币|以太坊|狗狗币|加密货币|数字货币|虚拟币|币圈|股票|个股|美股|港股|a股|大盘|上证|深证|创业板|纳斯达克|道琼斯|"
            r"恒生|指数|基金|黄金|金价|白银|银价|油价|原油|汽油|柴油|期货|茅台|腾讯|阿里|苹果公司|特斯拉)"
            r".{0,10}(?:价格|价钱|多少钱|报价|行情|涨|跌|收盘|开盘|市值|净值|走势|多少了|现价|每克|一克|一盎司)"
            r"|股价|币价|金价|油价|行情|涨停|跌停|收盘价|开盘价|市值|净值"
            # what a thing sells for by the unit: a market price
            r"|多少钱一(?:斤|两|克|公斤|升|吨)|一(?:斤|两|公斤|升)多少钱"
        ),
    ),
    (
        "zh_currency",
        re.compile(
            r"(?<!什么是)汇率(?!是什么|的定义|制度|理论|怎么形成|如何形成)|换汇|(?:美元|美金|人民币|欧元|日元|英镑|港币|港元|韩元|卢布|泰铢|澳元|加元|新台币|越南盾)"
            r".{0,6}(?:兑|换|等于|折合|能换|可以换|是多少|多少)"
        ),
    ),
    (
        "zh_weather",
        re.compile(
            r"天气|气温|温度多少|(?:今天|明天|后天|现在|今晚|明早|周末|这周|下周|早上|晚上|白天|中午)(?:的)?(?:气温|温度)?(?:是)?"
            r"(?:多少度|几度)|下雨|下雪|降雨|暴雨|大雨|小雨|雷阵雨|台风|雾霾|空气质量|pm2\.?5|"
            r"冷不冷|热不热|刮风|大风|阴天|多云|紫外线|预报|寒潮|带伞|风浪|浪大|海浪|能见度|结冰|路滑"
        ),
    ),
    (
        "zh_score",
        re.compile(
            r"比分|谁赢了|谁赢|赢了吗|输了吗|赢了没|输了没|赛果|战况|几比几|比赛结果|积分榜|排名榜|夺冠了|开奖|中奖号码"
        ),
    ),
    (
        "zh_status",
        re.compile(
            r"航班.{0,8}(?:延误|晚点|取消|起飞|到达|状态)|延误了|晚点了|还有货|有没有货|有货吗|还有库存|库存还有|余票|还有票|"
            r"还有房|有空房|(?:门票|票)还(?:能|可以)?(?:买到|买|有)|还能买到|抢到票|售罄|卖完了吗|还开着|营业了吗|在营业|路况|堵车|新闻(?!稿|学|专业|写作|联播)|头条|热搜|快讯"
        ),
    ),
    (
        "zh_present",
        re.compile(
            r"现在(?!你是|你来|请你|开始扮演|进行时)|今天|今日|今晚|今早|目前|此刻|此时|最新|实时|刚刚|"
            r"昨天|昨晚|这几天|这两天|"
            r"当前(?!目录|路径|文件|分支|行|页|元素|节点|对象|函数|版本号|线程)|"
            r"最近(?:的)?(?:新闻|消息|动态|价格|行情)"
        ),
    ),
)

# Words a realtime rule fires on that, in some turns, ask about no moment: "now" opening an
# instruction ("Now into Spanish"), the present of an imagined scene, the weather of a season
# ("the weather in Kyoto in November"), how weather works ("台风是怎么形成的"); the last two hold
# only where the turn names no moment.
_DISCOURSE_NOW: Final = re.compile(r"^now,? (?=[a-z])")
# the asker's next step in their own situation ("My order arrived broken. What should I do now?",
# "我现在该怎么办"): its "now" is the point the conversation has reached, not the clock's, so the
# answer is the same whenever it is asked; only where the question ends with it (nothing asked of a
# place or a thing: "What should I do now in Paris?" still asks what is on)
_NEXT_STEP_EN: Final = re.compile(
    r"(?:^|(?<=[,.;:!?] ))(?:(?:so|and|ok(?:ay)?|well|then),? )?(?:(?:right )?now,? )?"
    r"(?:what (?:should|shall|can|could|do|must) (?:i|we) do|what (?:are|'re) (?:my|our) options|"
    r"what(?:'s| is| are) (?:my |our |the )?next steps?|how (?:should|do|can|could) (?:i|we) proceed|"
    r"what happens|what now|now what)"
    r"(?: (?:right )?now)?(?=\s*(?:[?.!,;]|$))"
)
_NEXT_STEP_ZH: Final = re.compile(
    r"(?:我|我们)?现在(?:我|我们)?(?:应该|该|要|需要|可以|能)?(?:怎么办|咋办|怎么做|怎么处理|如何处理|做什么|干什么|如何是好)"
    r"(?=[?？。!！,，]|呢|啊|呀|$)"
)
# a task whose time words say when to do it or what to write about, not what is true now:
# "Schedule a meeting at 4pm later this week", "Help me write a headline on the latest discovery",
# "请帮我构建一个关于最新发现的文章标题"
_SCHEDULING: Final = re.compile(
    r"^(?:(?:can|could|would|will) you (?:kindly |please )?|please |kindly )*"
    r"(?:schedule|reschedule|make an appointment|book an? (?:meeting|appointment|room)|"
    r"set (?:up )?(?:a|an|my) (?:reminder|alarm|appointment|meeting)|remind me|"
    r"(?:add|put) .{0,60} (?:to|in|into|on) (?:my |the )?calendar)"
)
_WRITING: Final = re.compile(
    r"^(?:(?:can|could|would) you |please |help me |i need you to )*"
    r"(?:write|draft|compose|construct|create|craft|come up with|generate|suggest)\b.{0,40}?"
    + whole_words(
        r"headlines?|titles?|articles?|essays?|poems?|stor(?:y|ies)|posts?|tweets?|slogans?|captions?|"
        r"limericks?|haikus?|songs?|lyrics|jokes?|scripts?|speech(?:es)?"
    )
    + r"|^(?:请)?(?:帮我|给我|为我)?(?:写|构建|起|拟|创作|编|想)[^?？]{0,30}?(?:标题|文章|诗|故事|文案|口号|推文)"
)
# a role set up for the model to play ("把自己想象成一名医生", "Act as a nutritionist"): its
# diseases and patients are the scenario, not the asker's body, unless the asker brings their own
_ROLE_PLAY: Final = re.compile(
    r"^(?:请你?|please )?(?:把自己想象成|想象你是|假设你是|你现在是|扮演|请扮演|"
    r"imagine (?:that )?you(?:'re| are)|act as|pretend (?:to be|you(?:'re| are))|you are now|play the role of)"
)
_FIRST_PERSON: Final = re.compile(whole_words(r"i|i'm|i've|i'd|me|my|mine|we|our|us") + r"|我|咱|俺")
_HYPOTHETICAL: Final = re.compile(r"^(?:imagine|suppose|pretend|let's say|假设|想象|假如)")
_CLIMATE_EN: Final = re.compile(
    whole_words(r"in|during")
    + r" (?:the )?"
    + whole_words(
        r"january|february|march|april|may|june|july|august|september|october|november|december|"
        r"spring|summer|autumn|fall|winter|rainy season|dry season"
    )
    + "|"
    + whole_words(r"usually|typically|on average|average|climate|generally|normally")
)
_MOMENT_EN: Final = re.compile(
    whole_words(
        r"today|tomorrow|tonight|now|right now|currently|later|this|next|weekend|"
        r"monday|tuesday|wednesday|thursday|friday|saturday|sunday"
    )
)
# weather as the premise of what to do ("on a rainy Sunday", "下雨天…打发时间"): the answer is for
# the weather named, whatever it is outside; a moment named ("today") asks the weather too
_WEATHER_PREMISE_EN: Final = re.compile(
    whole_words(r"(?:on|for) an? (?:rainy|snowy|wet|cold|hot|sunny|windy|stormy|gloomy|cloudy|grey|gray)")
    + r" (?:[a-z]+ )?"
    + whole_words(r"days?|mornings?|afternoons?|evenings?|nights?|weekends?|sundays?|saturdays?")
    + "|"
    + whole_words(r"rainy[- ]day|snow days?")
)
_WHAT_TO_DO_EN: Final = re.compile(
    whole_words(
        r"what (?:should|can|could|to|do) (?:i|we|you|the kids)? ?do|things to do|activit(?:y|ies)|ideas?|"
        r"bored|boring|suggest(?:ions?)?|recommend(?:ations?)?|games?|fun"
    )
)
_WEATHER_PREMISE_ZH: Final = re.compile(
    r"(?:下雨|下雪|阴雨|雨|雪|大热|冷|阴)天(?:里|的时候)?.{0,12}?(?:做什么|干什么|干嘛|做些什么|玩什么|去哪|打发时间|无聊|适合|建议|推荐|活动)"
)
_DEIXIS_EN: Final = re.compile(
    whole_words(r"today|tonight|tomorrow|now|right now|currently|this (?:morning|afternoon|evening|week|weekend)|later")
)
# "yet" asks after a state only in a question ("Has it arrived yet?"); in an instruction to the
# model ("don't tell me the answer yet") it is when to do it
_STATE_QUESTION_EN: Final = re.compile(
    r"\?|^(?:(?:so|and|but|ok(?:ay)?),? )?(?:has|have|had|is|are|was|were|did|does|do|am|can|will|would)\b"
)
# a day that says when the asker goes out, in a request for a place to eat or stay ("今晚到外面吃，
# 推荐个餐馆", "今天朋友过来，找个酒店"): what is recommended stands whatever the day, unless
# the turn asks what holds that day (open, rooms left, a show, the weather)
_PLAN_ZH: Final = re.compile(
    r"(?:今晚|今天|今日|今早)[^,.?!。？]{0,6}?(?:到|去|来|过来|出去|外出|出门|吃|住|出发|玩|聚)"
)
_PLACE_ASKED_ZH: Final = re.compile(
    r"(?:推荐|找一?[个家间]|有没有)[^.?。？]{0,30}?(?:餐馆|餐厅|饭店|酒店|宾馆|景点|民宿)"
    r"|(?:餐馆|餐厅|饭店|酒店|宾馆|景点|民宿)[^.?。？]{0,20}?(?:推荐|找一?[个家间])"
)
_LIVE_ZH: Final = re.compile(r"开门|营业|关门|开放|还有|有房|空房|有票|人多|排队|堵|天气|下雨|演出|比赛|活动")
_EXPLAINS_ZH: Final = re.compile(r"怎么形成|如何形成|是怎么|为什么|原理|是什么|什么是|的成因")
_MOMENT_ZH: Final = re.compile(
    r"今天|明天|后天|现在|今晚|明早|这周|本周|下周|周末|几点|一会|马上|最近|目前|星期|周[一二三四五六日天]"
)


def _exempt(name: str, pattern: re.Pattern[str], asked: str) -> bool:
    if name in ("en_present", "zh_present") and _HYPOTHETICAL.search(asked):
        return True  # a scenario set up to reason about: "想象你正在参加比赛……你现在的位置是什么"
    if name in ("en_present", "zh_present") and (_SCHEDULING.search(asked) or _WRITING.search(asked)):
        return True
    if name in ("en_weather", "zh_weather") and _WRITING.search(asked):
        return True  # the weather of a story, a poem, a song: what to write about, not a forecast
    if name == "zh_present" and _PLAN_ZH.search(asked) and _PLACE_ASKED_ZH.search(asked):
        return not _LIVE_ZH.search(asked)
    if name == "zh_present":
        return not pattern.search(_NEXT_STEP_ZH.sub("", asked))
    if name == "en_present":
        present = {m.group(0) for m in pattern.finditer(_NEXT_STEP_EN.sub("", _DISCOURSE_NOW.sub("", asked)))}
        return not present or (present == {"yet"} and not _STATE_QUESTION_EN.search(asked))
    if name == "en_weather":
        if _WEATHER_PREMISE_EN.search(asked) and _WHAT_TO_DO_EN.search(asked):
            return not _DEIXIS_EN.search(asked)
        return bool(_CLIMATE_EN.search(asked)) and not _MOMENT_EN.search(asked)
    if name == "zh_weather":
        explains = _EXPLAINS_ZH.search(asked) or _WEATHER_PREMISE_ZH.search(asked)
        return bool(explains) and not _MOMENT_ZH.search(asked)
    return False


def fold(text: str) -> str:
    """Width-folded, lowercased, single-spaced: the form every rule is written against."""
    folded = unicodedata.normalize("NFKC", text).lower().replace("’", "'")
    return re.sub(r"\s+", " ", folded).strip()


def never_cache_match(text: str) -> NeverCacheMatch | None:
    """The never-cache intent of one user turn, or None. Medical first: "今天头疼" is about a body
    before it is about a day, and either way it is not cached. Medical reads the whole turn,
    realtime the user's own words (``asked_words``)."""
    return match_folded(fold(text), fold(asked_words(text)))


def match_folded(folded: str, asked: str) -> NeverCacheMatch | None:
    """``never_cache_match`` for a turn already folded, with its own words folded (``asked``)."""
    if not folded:
        return None
    if not (_ROLE_PLAY.search(folded) and not _FIRST_PERSON.search(folded)):
        for name, pattern in MEDICAL_RULES:
            if pattern.search(folded):
                return NeverCacheMatch(MEDICAL, name)
    for name, pattern in _REALTIME_RULES:
        if pattern.search(asked) and not _exempt(name, pattern, asked):
            return NeverCacheMatch(REALTIME, name)
    return None
