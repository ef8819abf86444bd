"""Coarse tags of a conversation: entities, numeric constraints, intent keywords, reset and
correction phrases, and a task skeleton.

Extraction is deliberately conservative: a missed entity costs at most a wrong hit that the
validator may still catch, but a garbage entity makes every paraphrase of a request miss.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from proxy.text.normalize import CJK, Segmenter, default_segmenter, normalize_text

Op = Literal["<=", ">=", "="]


def _wordset(words: str) -> frozenset[str]:
    return frozenset(words.split())


# --- gazetteers -----------------------------------------------------------------------------
# Places people ask about most, with their English spellings folded onto the Chinese name so that
# "Hangzhou" and "杭州" are one entity. Each entry: canonical=alias,alias.
_PLACE_ROWS: Final = """
北京=beijing,peking|上海=shanghai|天津=tianjin|重庆=chongqing|广州=guangzhou,canton|深圳=shenzhen
杭州=hangzhou|苏州=suzhou|南京=nanjing|成都=chengdu|武汉=wuhan|西安=xi'an,xian|长沙=changsha
厦门=xiamen|青岛=qingdao|大连=dalian|沈阳=shenyang|哈尔滨=harbin|昆明=kunming|丽江=lijiang
大理=dali|三亚=sanya|海口=haikou|拉萨=lhasa|桂林=guilin|贵阳=guiyang|南宁=nanning|福州=fuzhou
济南=jinan|郑州=zhengzhou|合肥=hefei|南昌=nanchang|太原=taiyuan|石家庄=shijiazhuang|兰州=lanzhou
乌鲁木齐=urumqi|呼和浩特=hohhot|西宁=xining|银川=yinchuan|长春=changchun|宁波=ningbo|无锡=wuxi
扬州=yangzhou|绍兴=shaoxing|黄山=huangshan|张家界=zhangjiajie|九寨沟=jiuzhaigou|敦煌=dunhuang
洛阳=luoyang|珠海=zhuhai|东莞=dongguan|佛山=foshan|温州=wenzhou|烟台=yantai|威海=weihai
香港=hong kong,hongkong|澳门=macau,macao|台北=taipei|台湾=taiwan|新疆=xinjiang|西藏=tibet
云南=yunnan|四川=sichuan|浙江=zhejiang|江苏=jiangsu|广东=guangdong|福建=fujian|山东=shandong
海南=hainan|湖南=hunan|湖北=hubei|河南=henan|河北=hebei|山西=shanxi|陕西=shaanxi|贵州=guizhou
广西=guangxi|江西=jiangxi|安徽=anhui|甘肃=gansu|青海=qinghai|内蒙古=inner mongolia|辽宁=liaoning
吉林=jilin|黑龙江=heilongjiang|宁夏=ningxia|中国=china|日本=japan|韩国=korea,south korea
美国=usa,united states,america|英国=uk,united kingdom,britain,england|法国=france|德国=germany
意大利=italy|西班牙=spain|泰国=thailand|新加坡=singapore|马来西亚=malaysia|越南=vietnam
澳大利亚=australia|新西兰=new zealand|加拿大=canada|俄罗斯=russia|印度=india|瑞士=switzerland
瑞典=sweden|荷兰=netherlands,holland|希腊=greece|埃及=egypt|迪拜=dubai|冰岛=iceland
东京=tokyo|大阪=osaka|京都=kyoto|首尔=seoul|曼谷=bangkok|巴黎=paris|伦敦=london|纽约=new york,nyc
洛杉矶=los angeles|旧金山=san francisco|西雅图=seattle|芝加哥=chicago|波士顿=boston|罗马=rome
巴塞罗那=barcelona|柏林=berlin|悉尼=sydney|墨尔本=melbourne|温哥华=vancouver|多伦多=toronto
巴厘岛=bali|普吉岛=phuket|马尔代夫=maldives|夏威夷=hawaii|拉斯维加斯=las vegas|维也纳=vienna
"""
_SURNAMES: Final = frozenset(
    "王李张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗郑梁谢宋唐许韩冯邓曹彭曾肖田董袁潘于蒋蔡余杜叶程苏魏吕丁任沈"
    "姚卢姜崔钟谭陆汪范金石廖贾夏韦付方白邹孟熊秦邱江尹薛闫段雷侯龙史陶黎贺顾毛郝龚邵万钱严覃武戴莫孔向汤"
)
_COMPOUND_SURNAMES: Final = ("欧阳", "司马", "诸葛", "上官", "东方", "慕容", "令狐", "皇甫", "长孙", "宇文")
# Words jieba's name and place taggers get wrong in ordinary requests.
_NOT_PEOPLE: Final = _wordset(
    "谢谢 谢谢您 多谢 多谢您 明白 王朝 王府 王府井 金沙 胡同 江湖 高兴 高端 高铁 马上 马路 周边 周末 周到 "
    "方便 方面 方向 白天 程序 任何 于是 余额 叶子 常用 平安 安全 孙子 石头 黄金 毛病 武器 戴着 曾经 雷达 "
    "龙虾 史上 万达 钱包 严重 孔雀 向导 汤圆 温泉 宋庄 祝您 建议您 真是太 老公 田园 林荫 江南 江边 邱吉尔"
)
_NOT_PLACES: Final = _wordset(
    "东西 南北 东北 西北 东南 西南 中东 大街 西路 东路 南路 北路 中路 南站 北站 东站 西站 商城 山水 海鲜 "
    "港湾 牡丹 蓝海 天伦 贵都 锦江 建国 香江 祥云 中安 美洲 亚洲 欧洲 非洲 太平洋 大西洋 三鲜 东门 西门 "
    "南门 北门 北口 南口 东口 西口 中心店 大饭店 海外 国外 国内 本地 当地 外地 全国 各地 城里 乡下 市区 "
    "郊区 市中心 老家 山上 山下 江南 华东 华北 华南 东方 西方 南方 北方 中华 内地"
)
_WEAK_PLACE_SUFFIXES: Final = ("大街", "路", "街", "门", "口", "站", "店")
_STRONG_PLACE_SUFFIXES: Final = tuple("市省区县镇村州岛湖山寺宫园")
_PLACE_FLAGS: Final = frozenset({"ns", "nsf"})
_PERSON_FLAGS: Final = frozenset({"nr", "nrfg", "nrt"})

_BRANDS: Final = (
    "macbook|iphone|ipad|imac|airpods|apple watch|thinkpad|thinkbook|xps|surface|galaxy|pixel|kindle|"
    "华为|huawei|小米|xiaomi|红米|redmi|联想|lenovo|戴尔|dell|惠普|华硕|asus|宏碁|acer|三星|samsung|索尼|sony|"
    "荣耀|honor|oppo|vivo|一加|oneplus|微软|microsoft|机械革命|雷神|外星人|alienware|拯救者|legion|小新|"
    "佳能|canon|尼康|nikon|富士|fujifilm|大疆|dji|特斯拉|tesla|比亚迪|byd|蔚来|nio|宝马|bmw|奔驰|"
    "mercedes|奥迪|audi|丰田|toyota|本田|honda|大众|volkswagen|耐克|nike|阿迪达斯|adidas|戴森|dyson|"
    "ps5|playstation|xbox|任天堂|nintendo|苹果手机|苹果电脑|苹果笔记本"
)
_PRODUCT: Final = re.compile(
    rf"(?<![a-z])({_BRANDS})((?:\s?(?:[a-z]{{0,6}}\d+[a-z0-9]*|pro|max|air|plus|ultra|mini|note|carbon|mate|"
    rf"nova|yoga|book|laptop|studio|se)(?![a-z]))*)"
)

# --- numbers --------------------------------------------------------------------------------
_EN_NUMBERS: Final = {
    word: str(value)
    for value, word in enumerate(
        ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")
    )
}
_EN_NUMBER_WORD: Final = re.compile(r"\b(" + "|".join(_EN_NUMBERS) + r")\b(?=[ -][a-z])")
_NUM: Final = r"\d+(?:\.\d+)?"
_CURRENCY_BEFORE: Final = {"¥": "CNY", "$": "USD", "€": "EUR", "£": "GBP", "rmb": "CNY", "usd": "USD"}
_CURRENCY_AFTER: Final = {
    "元": "CNY", "块钱": "CNY", "块": "CNY", "人民币": "CNY", "rmb": "CNY", "cny": "CNY", "yuan": "CNY",
    "美元": "USD", "美金": "USD", "dollars": "USD", "dollar": "USD", "bucks": "USD", "usd": "USD",
    "欧元": "EUR", "euros": "EUR", "euro": "EUR", "eur": "EUR", "英镑": "GBP", "pounds": "GBP",
}  # fmt: skip
_MONEY: Final = re.compile(
    rf"(?<![a-z\d.])(?P<pre>¥|\$|€|£|rmb ?|usd ?)?(?P<lo>{_NUM})(?:\s?(?:-|~|到|至|to)\s?(?:¥|\$|€|£)?(?P<hi>{_NUM}))?"
    rf"\s?(?P<post>{'|'.join(sorted(_CURRENCY_AFTER, key=len, reverse=True))}(?![a-z]))?"
)
_BUDGET_CUE: Final = re.compile(r"预算|budget|afford|spend|花费|价位|控制在|价格区间|price range")
_PRICE_CUE: Final = re.compile(r"价格|售价|报价|价钱|定价|到手价|门票|票价|人均|房价|price|costs?|priced|fare|fee")
_CEILING_CUE: Final = re.compile(
    r"不超过|不高于|最多|至多|低于|少于|不到|以内|以下|之内|under|below|less than|within|at most|max|up to|"
    r"no more than|cheaper than|or less"
)
_FLOOR_CUE: Final = re.compile(r"以上|起步|不低于|至少|at least|more than|over|above|or more|minimum")
_UNITS: Final[tuple[tuple[str, str, str, float], ...]] = (
    # (pattern, slot, unit, factor): the first matching unit after a number decides its slot
    (r"日游|天(?![后前以之])|-?days?(?! ago| later| before| after)", "duration_days", "day", 1.0),
    (r"个?(?:星期|礼拜)|周(?![一二三四五六日天末])|-?weeks?", "duration_days", "day", 7.0),
    (r"晚|夜|-?nights?", "nights", "night", 1.0),
    (r"个?小时|-?hours?", "duration_hours", "hour", 1.0),
    (r"公斤|千克|kg|kilos?|kilograms?", "weight", "kg", 1.0),
    (r"斤", "weight", "kg", 0.5),
    (r"克|grams?", "weight", "kg", 0.001),
    (r"lbs?|pounds?(?! sterling)", "weight", "kg", 0.4536),
    (r"个?人|位|people|persons?|adults?|guests?|travell?ers?", "party_size", "person", 1.0),
    (r"句话?|sentences?", "count", "sentence", 1.0),
    (r"段|paragraphs?", "count", "paragraph", 1.0),
    (r"字|words?", "length", "word", 1.0),
    (r"款|种|个|条|本|台|部|家|首|篇|项|件|道|套|名|份|处|座", "count", "item", 1.0),
    (
        r"(?:[a-z][a-z-]* ){0,2}?(?:bullet points?|items?|options?|ideas?|examples?|tips?|points?|reasons?|ways?|"
        r"books?|products?|laptops?|phones?|recommendations?|suggestions?|names?|places?|restaurants?|hotels?|"
        r"questions?|steps?|attractions?|dishes|titles?|slogans?|lines?|movies?|films?|songs?|recipes?)\b",
        "count",
        "item",
        1.0,
    ),
)
_UNIT_RES: Final = tuple((re.compile(p), s, u, f) for p, s, u, f in _UNITS)

_MONTH_NAMES: Final = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTHS: Final = {m: i + 1 for i, m in enumerate(_MONTH_NAMES)}
_MONTH_RE: Final = r"(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?"
_DATE_PATTERNS: Final = (
    (re.compile(r"(?<!\d)(\d{4})[-/.](\d{1,2})[-/.](\d{1,2})(?!\d)"), "ymd"),
    (re.compile(r"(?:(\d{4})年)?(\d{1,2})月(\d{1,2})[日号]"), "ymd"),
    (re.compile(rf"\b{_MONTH_RE} (\d{{1,2}})(?:st|nd|rd|th)?\b(?:,? (\d{{4}}))?"), "mdy"),
    (re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)? (?:of )?{_MONTH_RE}(?:,? (\d{{4}}))?"), "dmy"),
)
_WEEKDAYS: Final = re.compile(
    r"\b(monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b|(?:星期|周|礼拜)([一二三四五六日天1-7])"
)
_EN_WEEKDAYS: Final = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_WEEKDAY_VALUE: Final = {**{d: i + 1 for i, d in enumerate("一二三四五六")}, "日": 7, "天": 7}
_CLOCK: Final = re.compile(
    r"(?<![\d:.])(?P<h12>\d{1,2})(?::(?P<m12>\d{2}))?\s?(?P<ampm>am|pm|a\.m\.|p\.m\.)"
    r"|(?<![\d:.])(?P<h24>\d{1,2}):(?P<m24>\d{2})(?![\d:])"
    # 3点 alone is as often "3 points" (给我3点建议) as 3 o'clock: a time needs a period or a suffix
    r"|(?P<period>上午|早上|中午|下午|晚上|凌晨|今晚|明早|今天|明天|后天)?(?<!\d)(?P<hzh>\d{1,2})点(?P<tail>半|钟|整|\d{1,2}分?)?"
)


@dataclass(frozen=True)
class NumericConstraint:
    """A number the user pinned: ``budget <= 8000 CNY``, ``duration_days = 3 day``."""

    slot: str
    value: float
    unit: str
    op: Op = "="

    def key(self) -> tuple[str, float]:
        value = self.value % 10000 if self.slot == "date" and self.value >= 10000 else self.value
        return (self.op, round(value, 4))


@dataclass(frozen=True)
class Entities:
    """The entities of a text or, merged, the ones still in force in a conversation."""

    places: frozenset[str] = field(default_factory=frozenset)
    products: frozenset[str] = field(default_factory=frozenset)
    people: frozenset[str] = field(default_factory=frozenset)
    numbers: tuple[NumericConstraint, ...] = ()

    def is_empty(self) -> bool:
        return not (self.places or self.products or self.people or self.numbers)

    def slots(self) -> frozenset[str]:
        return frozenset(n.slot for n in self.numbers)

    def values(self, slot: str) -> tuple[NumericConstraint, ...]:
        return tuple(n for n in self.numbers if n.slot == slot)

    def to_json(self) -> dict[str, Any]:
        return {
            "places": sorted(self.places),
            "products": sorted(self.products),
            "people": sorted(self.people),
            "numbers": [[n.slot, n.value, n.unit, n.op] for n in self.numbers],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Entities:
        return cls(
            places=frozenset(data.get("places", ())),
            products=frozenset(data.get("products", ())),
            people=frozenset(data.get("people", ())),
            numbers=tuple(NumericConstraint(s, float(v), u, o) for s, v, u, o in data.get("numbers", ())),
        )


def _alias_table() -> dict[str, str]:
    table: dict[str, str] = {}
    for row in _PLACE_ROWS.replace("\n", "|").split("|"):
        if row.strip():
            canonical, aliases = row.strip().split("=")
            table[canonical] = canonical
            table.update((alias, canonical) for alias in aliases.split(","))
    return table


_PLACE_ALIASES: Final = _alias_table()
_EN_PLACE: Final = re.compile(
    r"(?<![a-z'])("
    + "|".join(sorted((re.escape(a) for a in _PLACE_ALIASES if a.isascii()), key=len, reverse=True))
    + r")(?![a-z])"
)


def canonical_place(name: str) -> str:
    name = name.strip().lower()
    if name in _PLACE_ALIASES:
        return _PLACE_ALIASES[name]
    if len(name) >= 3 and name[-1] in "市省" and name[:-1] in _PLACE_ALIASES:
        return _PLACE_ALIASES[name[:-1]]
    return name


def _is_place(word: str) -> bool:
    if word in _PLACE_ALIASES or canonical_place(word) in _PLACE_ALIASES:
        return True
    if len(word) < 2 or word in _NOT_PLACES or not re.fullmatch(rf"[{CJK}]+", word):
        return False
    if len(word) == 2:
        return word.endswith(_STRONG_PLACE_SUFFIXES)
    return not (word[0] in "东南西北中" and word[1:].endswith(_WEAK_PLACE_SUFFIXES))


def _is_person(word: str) -> bool:
    if word in _NOT_PEOPLE or word in _PLACE_ALIASES or not re.fullmatch(rf"[{CJK}]+", word):
        return False
    if word.startswith(_COMPOUND_SURNAMES):
        return 3 <= len(word) <= 4
    return 2 <= len(word) <= 3 and word[0] in _SURNAMES


_EN_PERSON: Final = re.compile(
    r"\b(?:mr|mrs|ms|miss|dr|prof)\.? ([a-z][a-z'-]+)|\bmy (?:boss|friend|wife|husband|colleague|manager|mom|"
    r"dad|mother|father|sister|brother|son|daughter|teacher|client) ([a-z][a-z'-]+)(?=[ ,.!?]|$)"
)
_EN_NOT_NAMES: Final = _wordset("and or is was has will who to for at in on with about")


# jieba's name tag fires on shop names, dishes and places (韩式, 杨梅, 宋家庄); a name counts only
# next to a word that says a person is meant (给李娜写, 王经理, 同事张伟).
_PERSON_BEFORE: Final = _wordset(
    "给 叫 问 找 联系 通知 邀请 提醒 告诉 回复 感谢 致 朋友 同事 老板 客户 领导 老师 同学 亲爱的 尊敬的 "
    "我是 名叫 叫做 帮 替 陪 把 让 请"
)
_PERSON_AFTER: Final = (
    "先生", "女士", "老师", "经理", "总", "同学", "医生", "教授", "小姐", "阿姨", "叔叔", "生日", "说", "同志", "老板",
)


def _person_context(tagged: Sequence[tuple[str, str]], i: int) -> bool:
    before = tagged[i - 1][0] if i > 0 else ""
    after = tagged[i + 1][0] if i + 1 < len(tagged) else ""
    return before in _PERSON_BEFORE or after.startswith(_PERSON_AFTER)


def _names(text: str, segmenter: Segmenter) -> tuple[frozenset[str], frozenset[str]]:
    places: set[str] = {_PLACE_ALIASES[m.group(1)] for m in _EN_PLACE.finditer(text)}
    people: set[str] = set()
    for m in _EN_PERSON.finditer(text):
        name = m.group(1) or m.group(2)
        if name not in _EN_NOT_NAMES:
            people.add(name)
    if re.search(rf"[{CJK}]", text):
        tagged = segmenter.tagged(text)
        for i, (word, flag) in enumerate(tagged):
            if (flag in _PLACE_FLAGS or word in _PLACE_ALIASES) and _is_place(word):
                places.add(canonical_place(word))
            elif flag in _PERSON_FLAGS and _is_person(word) and _person_context(tagged, i):
                people.add(word)
    return frozenset(places), frozenset(people)


def _products(text: str) -> frozenset[str]:
    found = set()
    for m in _PRODUCT.finditer(text):
        found.add(re.sub(r"\s+", " ", (m.group(1) + m.group(2)).strip()))
    return frozenset(found)


def _clause_before(text: str, start: int, width: int = 14) -> str:
    window = text[max(0, start - width) : start]
    return re.split(r"[,;!?\n]|\.(?!\d)", window)[-1]


def _money(text: str, taken: list[tuple[int, int]]) -> list[NumericConstraint]:
    found: list[NumericConstraint] = []
    for m in _MONEY.finditer(text):
        before, after = _clause_before(text, m.start()), text[m.end() : m.end() + 6]
        currency = _CURRENCY_BEFORE.get((m.group("pre") or "").strip()) or _CURRENCY_AFTER.get(m.group("post") or "")
        budget = bool(_BUDGET_CUE.search(before))
        cued = budget or bool(_PRICE_CUE.search(before))
        if currency is None and not (cued and not _unit_after(text, m.end())):
            continue
        taken.append(m.span())
        slot = "budget" if budget or _CEILING_CUE.search(before + after) else "price"
        unit = currency or ("CNY" if re.search(rf"[{CJK}]", before + after) else "")
        lo, hi = float(m.group("lo")), m.group("hi")
        if hi is not None:
            found += [NumericConstraint(slot, lo, unit, ">="), NumericConstraint(slot, float(hi), unit, "<=")]
            continue
        op: Op = "<=" if slot == "budget" else "="
        if _FLOOR_CUE.search(before + after[:4]):
            op = ">="
        elif _CEILING_CUE.search(before + after[:4]):
            op = "<="
        found.append(NumericConstraint(slot, lo, unit, op))
    return found


def _unit_after(text: str, end: int) -> tuple[str, str, float, str] | None:
    """Slot, unit, factor and the unit's own text, for the unit that follows a number."""
    rest = text[end : end + 30].lstrip()
    for pattern, slot, unit, factor in _UNIT_RES:
        match = pattern.match(rest)
        if match:
            return slot, unit, factor, match.group()
    return None


_CJK_MEASURES: Final = frozenset("款种个条本台部家首篇项件道套名份处座")
_RELATIVE_DAY: Final = re.compile(r"\s?(?:天|days?)?\s?(?:多|几|左右)?\s?(?:后|前|以后|之后|以前|ago|later)")
_COUNT_CUE: Final = re.compile(
    r"推荐|列出|列举|给我|来|找|写|介绍|提供|选|挑|整理|总结|生成|想要|需要|要|说出|举|"
    r"list|give me|suggest|recommend|top|write|name|provide|pick|choose|show me|find|in|with|into|generate"
)


def _quantities(text: str, taken: list[tuple[int, int]]) -> list[NumericConstraint]:
    found: list[NumericConstraint] = []
    for m in re.finditer(rf"(?<![a-z\d.:/-]){_NUM}(?![\d.:/])", text):
        if any(a <= m.start() < b for a, b in taken) or text[max(0, m.start() - 1) : m.start()] == "第":
            continue
        unit = _unit_after(text, m.end())
        if unit is None:
            continue
        slot, unit_name, factor, unit_text = unit
        before = _clause_before(text, m.start(), 10)
        if slot == "count" and unit_text[:1] in _CJK_MEASURES and not _COUNT_CUE.search(before):
            continue  # "3个" needs a request verb to be a count; "3 tips" says so itself
        if slot == "duration_days" and _RELATIVE_DAY.match(text, m.end()):
            continue  # 3天后 / 3 days later: a date offset, not a stay
        op: Op = "<=" if _CEILING_CUE.search(before + text[m.end() : m.end() + 8]) and slot == "weight" else "="
        found.append(NumericConstraint(slot, round(float(m.group()) * factor, 4), unit_name, op))
    return found


def extract_dates(text: str) -> tuple[NumericConstraint, ...]:
    """Calendar dates of a normalised text; value YYYYMMDD, or MMDD when the year is not given."""
    found: list[NumericConstraint] = []
    for pattern, order in _DATE_PATTERNS:
        for m in pattern.finditer(text):
            groups = m.groups()
            if order == "ymd":
                year, month, day = groups[0], int(groups[1]), int(groups[2])
            elif order == "mdy":
                month, day, year = _MONTHS[groups[0][:3]], int(groups[1]), groups[2]
            else:
                day, month, year = int(groups[0]), _MONTHS[groups[1][:3]], groups[2]
            if 1 <= month <= 12 and 1 <= day <= 31:
                value = (int(year) * 10000 if year else 0) + month * 100 + day
                found.append(NumericConstraint("date", float(value), "ymd" if year else "md"))
    return tuple(dict.fromkeys(found))


def _is_clock(m: re.Match[str]) -> bool:
    return not m.group("hzh") or bool(m.group("period") or m.group("tail"))


def _times(text: str) -> list[NumericConstraint]:
    found: list[NumericConstraint] = []
    for m in _WEEKDAYS.finditer(text):
        name, zh = m.group(1), m.group(2)
        value = _EN_WEEKDAYS.index(name) + 1 if name else _WEEKDAY_VALUE.get(zh) or int(zh)
        found.append(NumericConstraint("weekday", float(value), "weekday"))
    for m in _CLOCK.finditer(text):
        if m.group("h12"):
            hour, minute, pm = int(m.group("h12")), int(m.group("m12") or 0), m.group("ampm").startswith("p")
        elif m.group("h24"):
            hour, minute, pm = int(m.group("h24")), int(m.group("m24")), False
        elif _is_clock(m):
            hour, pm = int(m.group("hzh")), m.group("period") in ("下午", "晚上", "今晚")
            tail = m.group("tail") or ""
            minute = 30 if tail == "半" else int(tail.rstrip("分")) if tail[:1].isdigit() else 0
        else:
            continue
        if pm and hour < 12:
            hour += 12
        if hour <= 24 and minute < 60:
            found.append(NumericConstraint("time", float(hour * 100 + minute), "hhmm"))
    return found


def extract_numbers(text: str) -> tuple[NumericConstraint, ...]:
    """Numeric constraints of a normalised text, in order of appearance within each kind."""
    text = _EN_NUMBER_WORD.sub(lambda m: _EN_NUMBERS[m.group(1)], text)
    dates = extract_dates(text)
    blanked = text
    for pattern, _ in _DATE_PATTERNS:
        blanked = pattern.sub(lambda m: " " * len(m.group()), blanked)
    times = _times(blanked)
    blanked = _CLOCK.sub(lambda m: " " * len(m.group()) if _is_clock(m) else m.group(), blanked)
    taken: list[tuple[int, int]] = []
    money = _money(blanked, taken)
    return (*money, *_quantities(blanked, taken), *dates, *times)


def extract_entities(text: str, *, segmenter: Segmenter | None = None, normalized: bool = False) -> Entities:
    """Places, products, people and numeric constraints of one text (Chinese or English).

    ``normalized=True`` skips normalising again a text that already went through normalize_text.
    """
    seg = segmenter or default_segmenter()
    norm = text if normalized else normalize_text(text, segmenter=seg)
    places, people = _names(norm, seg)
    return Entities(places=places, products=_products(norm), people=people, numbers=extract_numbers(norm))


# --- conversation-level tags ------------------------------------------------------------------


def merge_entities(history: Sequence[Entities], current: Entities) -> Entities:
    """The entities still in force after ``history`` then ``current``: a later turn that names a
    slot (places, products, people, or a numeric slot such as budget) replaces that slot."""
    places: frozenset[str] = frozenset()
    products: frozenset[str] = frozenset()
    people: frozenset[str] = frozenset()
    numbers: dict[str, tuple[NumericConstraint, ...]] = {}
    for turn in (*history, current):
        places = turn.places or places
        products = turn.products or products
        people = turn.people or people
        for slot in dict.fromkeys(n.slot for n in turn.numbers):
            numbers.pop(slot, None)
            numbers[slot] = turn.values(slot)
    merged = tuple(n for values in numbers.values() for n in values)
    return Entities(places=places, products=products, people=people, numbers=merged)


def entities_conflict(a: Entities, b: Entities) -> list[str]:
    """Slots on which ``a`` and ``b`` disagree: both name the slot and share none of its values.

    Numeric slots compare per operator, so a budget range 100-150 conflicts with 100-200 (the
    ceilings differ) while a date range overlapping a single date does not.
    """
    conflicts = [
        name
        for name, left, right in (("places", a.places, b.places), ("products", a.products, b.products),
                                  ("people", a.people, b.people))
        if left and right and not left & right
    ]  # fmt: skip
    for slot in sorted(a.slots() & b.slots()):
        left = {n.key() for n in a.values(slot)}
        right = {n.key() for n in b.values(slot)}
        shared_ops = {op for op, _ in left} & {op for op, _ in right}
        if not shared_ops or any(
            not {v for op, v in left if op == o} & {v for op, v in right if op == o} for o in shared_ops
        ):
            conflicts.append(slot)
    return conflicts


@functools.lru_cache(maxsize=4096)
def _keyword_pattern(keyword: str) -> re.Pattern[str]:
    """Keywords come from the policy file: compiled once per keyword, not once per request."""
    keyword = normalize_text(keyword) if keyword.isascii() else keyword.lower()
    if re.search(r"[a-z0-9]", keyword) and keyword.isascii():
        return re.compile(rf"(?<![a-z0-9]){re.escape(keyword)}(?![a-z0-9])")
    return re.compile(re.escape(keyword))


def keyword_intent(
    text: str, keywords: Mapping[str, Sequence[str]], *, segmenter: Segmenter | None = None
) -> str | None:
    """The first intent (in mapping order) one of whose keywords occurs in ``text``.

    English keywords match whole words only ("now" does not fire on "know"); Chinese ones match
    as substrings of the normalised text.
    """
    norm = normalize_text(text, segmenter=segmenter)
    for intent, words in keywords.items():
        if any(_keyword_pattern(word).search(norm) for word in words if word.strip()):
            return intent
    return None


# A phrase counts only at the start of a clause, after filler words, so that
# "如何重新开始生活" or "how do I start over after a layoff" are questions, not resets.
_CLAUSE_START: Final = r"(?:^|[,.;!?:\n])\s?"
_ZH_FILLER: Final = r"(?:好吧|算了|那|那么|嗯|哎|唉|我们|咱们|请|让我们|你|还是|干脆|直接|先)*"
_EN_FILLER: Final = r"(?:(?:ok|okay|well|please|so|just|let's|let us|can we|could we|can you|you can|no|um|hmm),? ?)*"
_RESET: Final = re.compile(
    rf"{_CLAUSE_START}{_ZH_FILLER}(?:(?:重新开始|从头开始|从头来|重来)(?=$|[,.!?;]|吧|了|啊|呀|好吗|好不好|可以吗|哦)|忘了之前|忘掉之前|忘记之前|忘了前面|忘掉前面|"
    rf"忘记前面|忘了刚才|忘掉刚才|清空(?:上下文|对话|聊天记录|记录|历史)|开个新对话|开始新对话|之前的都不算)"
    rf"|{_CLAUSE_START}{_EN_FILLER}(?:start over|start again|start from scratch|restart the conversation|"
    rf"forget (?:everything|all (?:of )?that|what (?:i|we) said|the previous|our previous|our conversation)|"
    rf"reset (?:the |this |our )?(?:conversation|chat|context)|new conversation|clear (?:the )?(?:context|history))"
)
_CORRECTION: Final = re.compile(
    rf"{_CLAUSE_START}(?:不|嗯|呃|额|哎|唉|啊|可是|但是)?,?(?:不对(?![称劲付头路口等])|不是这个意思|不是这样的|"
    rf"不是我要的|这不是我(?:想)?要的|不是我想要的|我不是(?:这个意思|问这个|说这个|要这个)|我问的不是|错了(?!吗|么)|答非所问)"
    r"|你(?:说|讲|理解|搞|弄|算|答|写|回答|翻译|记)?错了|你(?:没|没有)(?:理解|明白|听懂|看懂)|你理解得不对"
    r"|(?:答案|回答|结果|你说的|你的回答|这个回答|这个答案)(?:是|完全|好像|似乎)?(?:不对|错的|错了|有误)"
    rf"|{_CLAUSE_START}(?:no,? )?(?:that'?s|that is|this is|it'?s|it is|you'?re|you are|you got it|all|"
    r"your answer is|the answer is)?\s?(?:wrong|incorrect|not right|not correct)(?! with| about)(?=[ ,.!?]|$)"
    r"|not what i (?:asked|meant|wanted|said|was asking)|you misunderstood|you misread|that'?s not it"
    r"|you (?:got|have) it wrong|i (?:didn'?t|did not) ask (?:for|about) (?:that|this)|that'?s not what i"
)


def is_reset_phrase(text: str, *, segmenter: Segmenter | None = None) -> bool:
    """Does the user ask to drop the conversation so far ("重新开始", "start over")?"""
    return bool(_RESET.search(normalize_text(text, segmenter=segmenter)))


def is_correction(text: str, *, segmenter: Segmenter | None = None) -> bool:
    """Does the user say the last answer was wrong ("不对", "你理解错了", "that's not what I asked")?"""
    return bool(_CORRECTION.search(normalize_text(text, segmenter=segmenter)))


_SKELETON_FLAGS: Final = frozenset({"n", "nr", "ns", "nt", "nz", "nrt", "vn", "v", "eng", "an", "l", "i"})
_ZH_STOP: Final = _wordset(
    "帮 帮忙 帮我 请 请问 可以 能 能够 需要 想 想要 要 觉得 知道 告诉 看看 一下 什么 怎么 怎么样 如何 为什么 "
    "是 有 没有 做 给 让 说 问 用 还有 这个 那个 这些 那些 东西 问题 时候 谢谢 好的 推荐 建议 了解 麻烦"
)
_EN_STOP: Final = _wordset(
    "the a an and or but if then of to in on at for with about from by as is are was were be been being do does "
    "did have has had can could would should will shall may might must i me my we our you your he she it its they "
    "them their this that these those what which who whom whose when where why how please help tell give make "
    "want need like just also some any more most very much many not no yes ok okay thanks thank let get know "
    "there here than so such into over under again up down out new one two three"
)


def _content_words(text: str, segmenter: Segmenter) -> list[str]:
    words: list[str] = re.findall(r"[a-z][a-z'-]{2,}", text)
    words = [w[:-1] if w.endswith("s") and len(w) > 4 else w for w in words if w not in _EN_STOP]
    if re.search(rf"[{CJK}]", text):
        for word, flag in segmenter.tagged(re.sub(r"[a-z0-9]+", " ", text)):
            if flag in _SKELETON_FLAGS and len(word) >= 2 and word not in _ZH_STOP and re.fullmatch(rf"[{CJK}]+", word):
                words.append(word)
    return words


def task_skeleton(texts: Sequence[str], *, top: int = 5, segmenter: Segmenter | None = None) -> str:
    """A few content keywords of a conversation, alphabetically, so paraphrases tend to agree.

    Later texts weigh more (the task drifts towards the latest turns); ties go to longer words.
    """
    seg = segmenter or default_segmenter()
    scores: dict[str, float] = {}
    for position, text in enumerate(texts):
        weight = 1.0 + position / max(1, len(texts))
        for word in _content_words(normalize_text(text, segmenter=seg), seg):
            scores[word] = scores.get(word, 0.0) + weight
    ranked = sorted(scores, key=lambda w: (-scores[w], -len(w), w))[:top]
    return " ".join(sorted(ranked))



# --- change instructions ----------------------------------------------------------------------
# Each rule names the kind of change its phrases make; matched against normalised text. Chinese
# phrases carry look-arounds for the everyday words that contain them (要不要, 不用谢, 特别, 区别).
_CHANGE_RULES: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    (
        "topic_switch",
        re.compile(
            r"换(?:个|一个)话题|聊(?:点|些)别的|说(?:点|些)别的|(?:另|另外)一个问题|别的问题|不(?:聊|说)这个了"
            r"|题外话|问个别的|说个别的|change the subject|change of (?:topic|subject)|new topic|another question"
            r"|(?:a )?different (?:topic|question)|unrelated (?:question|topic)|switching (?:topics|gears)"
            r"|on (?:a different|another) note|random question|off[- ]topic|something else entirely"
            r"|talk about something else"
        ),
    ),
    (
        "negation",
        re.compile(
            r"(?<!要)不要(?!紧|客气|担心|着急|急|谢)|(?<!用)不用(?!谢|客气|担心|着急|急)|不需要(?!谢)|不想要|取消|去掉|"
            r"删掉|删除|删了|排除|除去|拿掉|省掉|不含|不包括|不考虑|(?<!吃)不吃|(?<!喝)不喝|(?<!去)不去了?|(?<!住)不住"
            r"|(?<![特区类级告分个识性鉴辨差离派送道惜临话])别(?![人的处墅致名称针说扭再]|具一格)"
            r"|\b(?:don'?t|do not|dont)\b(?! (?:know|understand|think|mind|worry|get|care|remember|see|have to)\b)"
            r"|\b(?:remove|removing|without|exclude|excluding|drop|skip|cancel|avoid|except|no longer)\b"
            r"|leave out|get rid of|not include|no more"
            # "but no temples please", "no museums": a bare "no" before a noun excludes it
            r"|\b(?:but|and|with|,)\s+no\s+[a-z]{3,}|^no\s+(?!problem|thanks|thank|worries|idea|need)[a-z]{3,}s\b"
        ),
    ),
    (
        "addition",
        re.compile(
            r"加上|加个|加一|再加|多加|补充|还有|另外|增加(?!到)|添加|再来|再推荐|再给|再多|也要|也想|顺便|额外"
            r"|\b(?:also|add|adding|include|including|plus|additionally|another|extra)\b|as well|in addition"
            r"|\bmore (?:options|examples|ideas|details|choices|suggestions)\b"
        ),
    ),
    (
        "modification",
        re.compile(
            r"改成|改为|改到|改一下|改下|换成|换为|换到|换个|换一(?:个|家|款|种|下|批)|变成|调整|调到|提高|提升|增加到|"
            r"降到|降低|减少|减到|缩短|延长|推迟|提前到|放宽|而不是|其实|别的|其他的|其它的"
            r"|再[^\s,.!?]{1,3}(?:一点|一些|点|些)|更(?:轻|便宜|贵|快|慢|短|长|大|小|简单|详细|正式|近|远|安静|好)"
            r"|太(?:贵|重|远|长|短|多|少|难|简单|复杂|正式|大|小|满|累|赶|紧|挤|早|晚|辣|咸|油)了"
            r"|(?:轻松|便宜|实惠|简单|简短|通俗|详细|正式|口语化|清淡|安静|短|长|轻|快|慢|早|晚|近|少|多)(?:一点|一些)"
            r"|(?:^|[,.!?])(?:不|no|nope),|我(?:说|指)的是|换(?:个|一种)说法|用表格|列成表|列个表|如果换成|要是换成"
            r"|change (?:it |that |this |them )?to|switch (?:it )?to|\binstead\b|rather than|\b(?:increase|decrease|"
            r"reduce|raise|lower|cheaper|lighter|shorter|longer|bigger|smaller|faster|simpler|modify|update|swap|"
            r"replace|postpone|reschedule|rephrase|rewrite|reword|actually)\b|make it|move (?:it )?to"
            r"|\bmore (?:formal|casual|detailed|concise)\b|\bless (?:formal|expensive|detailed)\b"
            r"|too (?:expensive|heavy|long|short|far|much|many|formal|big|small)|(?:what|how) about|what if"
            r"|\b(?:restate|reformat|summarize it|shorten|expand)\b|in the form of"
            r"|(?:turn|convert) (?:it|that|this|your (?:answer|response)) into"
            r"|as a (?:table|list|bulleted list)|in (?:a table|bullet points|one sentence)"
            r"|i'?m talking about|i meant\b"
        ),
    ),
)


def change_signals(text: str, *, segmenter: Segmenter | None = None) -> tuple[str, ...]:
    """The change phrases of one turn as ``kind:phrase`` ("negation:不要", "modification:instead")."""
    norm = normalize_text(text, segmenter=segmenter)
    signals: list[str] = []
    for kind, pattern in _CHANGE_RULES:
        signals += [f"{kind}:{m.group().strip()}" for m in pattern.finditer(norm)]
    return tuple(dict.fromkeys(signals))


def change_instruction(text: str, *, segmenter: Segmenter | None = None) -> bool:
    """The coarse tag: does this turn negate, add to or modify what was asked before?"""
    return any(not s.startswith("topic_switch:") for s in change_signals(text, segmenter=segmenter))
