"""Which words of a user turn are the user's question, and which are material handed over.

Text handed over to be translated, rewritten, summarised or analysed is not the user's question:
"帮我把这句话翻译成英文:今天天气很好" asks for a translation, and its 天气 asks for no weather. Quoted
spans and titles (《今日说法》) are material too. The realtime rules (proxy/core/text/never_cache.py) and
the carry-over of a conversation (proxy/core/text/carry_over.py) read the user's own words; medical reads
the whole turn, since a symptom or a lab value pasted in a text is still someone's body.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

from proxy.core.text.patterns import whole_words

_HAND_OVER: Final = re.compile(
    whole_words(
        r"translat(?:e|ed|ing|ion)|rewrite|re-write|rephrase|paraphrase|reword|summari[sz]e|summary|tl;?dr|"
        r"proofread|polish|edit|correct|fix|shorten|simplify|improve|format|make (?:it|this) (?:sound|more|less)|"
        r"grammar|spelling|how do you say|what does|extract|analy[sz]e|identify|classify|categori[sz]e|parse"
    )
    + r"|翻译|翻成|译成|改写|改成|改得|改为|润色|总结|概括|摘要|缩写|扩写|校对|修改|纠正|精简|重写|转述|"
    r"改一下|提炼|语法|错别字|怎么说|什么意思|提取|分析|识别|分类|归类"
)
_QUOTED: Final = re.compile(
    r"“[^”]*”|\"[^\"]*\"|「[^」]*」|『[^』]*』|《[^》]*》|«[^»]*»|‘[^’]*’|(?<![a-z0-9])'[^'\n]{2,}'(?![a-z0-9])"
)
# material with no quote or colon round it: "translate good morning into french", "把今天天气很好
# 翻译成英文", "翻译一下今天天气很好", "今天天气很好用英语怎么说"
_BARE_MATERIAL: Final = re.compile(
    whole_words(r"translate|how do you say") + r" .+ " + whole_words(r"in|into|to") + r" [a-z]+$"
    r"|把.{1,80}?(?:翻译|翻成|译成|改写|改成|改得|改为|润色|缩写|扩写)|^(?:请|帮我|麻烦)?(?:翻译|翻成)(?:一下)?[,，]?.{2,}"
    r"|^.{2,}(?:用|的)?(?:英语|英文|日语|日文|中文|汉语|法语|韩语|德语)怎么说"
)
_SENTENCES: Final = re.compile(r"[^.!?。！？\n]+")


def asked_words(text: str) -> str:
    """The user's own words of one turn, lowercased (lines kept): quoted spans and titles left
    out, and "" for a turn that hands material over to be transformed ("Translate into French:
    ...", "...。翻译成英文"), whose answer is made from that material alone."""
    lowered = unicodedata.normalize("NFKC", text).lower().replace("’", "'").replace("‘", "'").strip()
    head, colon, rest = [*re.split(r"([:：\n])", lowered, maxsplit=1), "", ""][:3]
    if colon and rest.strip() and _HAND_OVER.search(head):
        return ""
    own = _QUOTED.sub(" ", lowered)
    if _HAND_OVER.search(own) and (own != lowered or _BARE_MATERIAL.search(own)):
        return ""
    sentences = [s.strip() for s in _SENTENCES.findall(own) if s.strip()]
    if len(sentences) > 1 and len(sentences[-1]) <= 40 and _HAND_OVER.search(sentences[-1]):
        return ""  # the instruction after its material: "It's raining today. Translate to French."
    return own
