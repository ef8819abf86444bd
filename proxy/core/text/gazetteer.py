"""Word lists the taggers read: places (with English spellings folded onto the Chinese name,
so that "Hangzhou" and "杭州" are one entity), surnames, brands, and words jieba mis-tags."""

from __future__ import annotations

import re
from typing import Final

from proxy.core.text.normalize import CJK


def wordset(words: str) -> frozenset[str]:
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
_NOT_PEOPLE: Final = wordset(
    "谢谢 谢谢您 多谢 多谢您 明白 王朝 王府 王府井 金沙 胡同 江湖 高兴 高端 高铁 马上 马路 周边 周末 周到 "
    "方便 方面 方向 白天 程序 任何 于是 余额 叶子 常用 平安 安全 孙子 石头 黄金 毛病 武器 戴着 曾经 雷达 "
    "龙虾 史上 万达 钱包 严重 孔雀 向导 汤圆 温泉 宋庄 祝您 建议您 真是太 老公 田园 林荫 江南 江边 邱吉尔"
)
_NOT_PLACES: Final = wordset(
    "东西 南北 东北 西北 东南 西南 中东 大街 西路 东路 南路 北路 中路 南站 北站 东站 西站 商城 山水 海鲜 "
    "港湾 牡丹 蓝海 天伦 贵都 锦江 建国 香江 祥云 中安 美洲 亚洲 欧洲 非洲 太平洋 大西洋 三鲜 东门 西门 "
    "南门 北门 北口 南口 东口 西口 中心店 大饭店 海外 国外 国内 本地 当地 外地 全国 各地 城里 乡下 市区 "
    "郊区 市中心 老家 山上 山下 江南 华东 华北 华南 东方 西方 南方 北方 中华 内地"
)
_WEAK_PLACE_SUFFIXES: Final = ("大街", "路", "街", "门", "口", "站", "店")
_STRONG_PLACE_SUFFIXES: Final = tuple("市省区县镇村州岛湖山寺宫园")
PLACE_FLAGS: Final = frozenset({"ns", "nsf"})
PERSON_FLAGS: Final = frozenset({"nr", "nrfg", "nrt"})

_BRANDS: Final = (
    "macbook|iphone|ipad|imac|airpods|apple watch|thinkpad|thinkbook|xps|surface|galaxy|pixel|kindle|"
    "华为|huawei|小米|xiaomi|红米|redmi|联想|lenovo|戴尔|dell|惠普|华硕|asus|宏碁|acer|三星|samsung|索尼|sony|"
    "荣耀|honor|oppo|vivo|一加|oneplus|微软|microsoft|机械革命|雷神|外星人|alienware|拯救者|legion|小新|"
    "佳能|canon|尼康|nikon|富士|fujifilm|大疆|dji|特斯拉|tesla|比亚迪|byd|蔚来|nio|宝马|bmw|奔驰|"
    "mercedes|奥迪|audi|丰田|toyota|本田|honda|大众|volkswagen|耐克|nike|阿迪达斯|adidas|戴森|dyson|"
    "ps5|playstation|xbox|任天堂|nintendo|苹果手机|苹果电脑|苹果笔记本"
)
PRODUCT: Final = re.compile(
    rf"(?<![a-z])({_BRANDS})((?:\s?(?:[a-z]{{0,6}}\d+[a-z0-9]*|pro|max|air|plus|ultra|mini|note|carbon|mate|"
    rf"nova|yoga|book|laptop|studio|se)(?![a-z]))*)"
)


def _alias_table() -> dict[str, str]:
    table: dict[str, str] = {}
    for row in _PLACE_ROWS.replace("\n", "|").split("|"):
        if row.strip():
            canonical, aliases = row.strip().split("=")
            table[canonical] = canonical
            table.update((alias, canonical) for alias in aliases.split(","))
    return table


PLACE_ALIASES: Final = _alias_table()
EN_PLACE: Final = re.compile(
    r"(?<![a-z'])("
    + "|".join(sorted((re.escape(a) for a in PLACE_ALIASES if a.isascii()), key=len, reverse=True))
    + r")(?![a-z])"
)


# --- areas ------------------------------------------------------------------------------------
# Parts of a town or region change the answer as much as the town does ("a cheap restaurant in
# the north part of town" is not "... in the south"). Both languages fold onto one English name.
_COMPASS: Final = {"north": "north", "south": "south", "east": "east", "west": "west",
                   "northeast": "northeast", "northwest": "northwest", "southeast": "southeast",
                   "southwest": "southwest", "north-east": "northeast", "north-west": "northwest",
                   "south-east": "southeast", "south-west": "southwest"}  # fmt: skip
_ZH_COMPASS: Final = {"东": "east", "西": "west", "南": "south", "北": "north", "东北": "northeast",
                      "西北": "northwest", "东南": "southeast", "西南": "southwest"}  # fmt: skip
_EN_DIRECTION: Final = "|".join(sorted(_COMPASS, key=len, reverse=True))
EN_AREA: Final = re.compile(
    rf"(?<![a-z])(?:(?P<dir>{_EN_DIRECTION})(?:ern)?(?:\s+|-)(?:part|side|end|area|district|region|quarter|suburbs?)"
    rf"|(?:in|on|at|to|near|around) the (?P<dir2>{_EN_DIRECTION})(?:ern)?(?! (?:korea|america|africa|pole|star|face))"
    rf"(?:\s+of (?:the )?(?:town|city))?(?![a-z])"
    rf"|(?P<dir3>{_EN_DIRECTION})side(?![a-z])"
    r"|(?P<centre>downtown|midtown|city cent(?:re|er)|town cent(?:re|er)|cent(?:re|er) of (?:the )?(?:town|city)|"
    r"(?:in|at|near|around) the cent(?:re|er)(?![a-z ]*of (?!town|the town|the city|city))|"
    r"central (?:part|area|district))"
    r"|(?P<suburbs>suburbs|outskirts|out of town))(?![a-z])"
)
ZH_AREA: Final = re.compile(
    r"(?P<dir>东北|西北|东南|西南|[东西南北])(?:边|部|区|面|侧|城|郊|片区)"
    r"|城(?P<dir2>东北|西北|东南|西南|[东西南北])"
    r"|(?P<centre>市中心|城市中心|中心城区|市区中心|老城区|城中心)"
    r"|(?P<suburbs>郊区|近郊|远郊|城郊)"
)


def area_of(match: re.Match[str], zh: bool) -> str:
    """The canonical English name of an area match of EN_AREA or ZH_AREA."""
    groups = match.groupdict()
    if groups.get("centre"):
        return "centre"
    if groups.get("suburbs"):
        return "suburbs"
    direction = next(v for k, v in groups.items() if k.startswith("dir") and v)
    return _ZH_COMPASS[direction] if zh else _COMPASS[direction]


def canonical_place(name: str) -> str:
    name = name.strip().lower()
    if name in PLACE_ALIASES:
        return PLACE_ALIASES[name]
    if len(name) >= 3 and name[-1] in "市省城" and name[:-1] in PLACE_ALIASES:
        return PLACE_ALIASES[name[:-1]]
    return name


def is_place(word: str) -> bool:
    if word in PLACE_ALIASES or canonical_place(word) in PLACE_ALIASES:
        return True
    if len(word) < 2 or word in _NOT_PLACES or not re.fullmatch(rf"[{CJK}]+", word):
        return False
    if len(word) == 2:
        return word.endswith(_STRONG_PLACE_SUFFIXES)
    return not (word[0] in "东南西北中" and word[1:].endswith(_WEAK_PLACE_SUFFIXES))


def is_person(word: str) -> bool:
    if word in _NOT_PEOPLE or word in PLACE_ALIASES or not re.fullmatch(rf"[{CJK}]+", word):
        return False
    if word.startswith(_COMPOUND_SURNAMES):
        return 3 <= len(word) <= 4
    return 2 <= len(word) <= 3 and word[0] in _SURNAMES
