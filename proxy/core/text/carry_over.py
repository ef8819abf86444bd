"""The never-cache intent a conversation carries over to its later turns.

A never-cache rule (``proxy.core.text.never_cache``) reads one turn; a follow-up is read with the turns
before it, one rule per family, decided once here:

- **medical** holds for the rest of the conversation it governs: every later turn is medical
  ("How long will it last?", "要多久才能好", "Can I still go to the gym?") until one clearly leaves the
  topic: a turn on a subject of its own (a name: "Did Cary Grant win any awards?", "C语言会吗"; a
  question of fact: "星座怎么算"; a task: "Write a haiku", "推荐几本小说"; or "by the way", "换个话
  题") that neither points back ("it", "she", "这个") nor names a symptom, a drug or a body part.
  A courtesy ("Thanks!", "谢谢") is never medical and does not end it.
- **realtime** (and any other never-cached intent the policy forces by keyword) holds only for
  the turns that lean on it, each on the one before: an elliptical turn ("And tomorrow?", "那上海
  呢", "In euros?"), a short one ("Which channel?", "要穿外套吗") or one that points back at the
  thing or place asked about ("Why did it go up?", "Should I take the 110 instead?"). A turn that
  asks something of its own ends it, whether short ("星座怎么算", "C语言会吗") or long, and so does
  a question of a fact that does not move with the clock ("How tall is it?", "Who designed it?").

What a turn says of its own is read from the user's words (``material.asked_words``): a text
handed over to translate or rewrite is a task of its own, and nothing in it leans on anything.
The benchmark that measures both directions is benchmarks/bench_never_cache.py.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

from proxy.core.text.material import asked_words
from proxy.core.text.never_cache import MEDICAL, NeverCacheMatch, fold, match_folded
from proxy.core.text.patterns import whole_words


@dataclass(frozen=True, slots=True)
class TurnReading:
    """What one user turn says for the never-cache rules, read once from its text."""

    match: NeverCacheMatch | None  # the rules on this turn alone
    asked: str  # the user's own words, folded ("" for a turn that hands material over)
    leans: bool  # elliptical, short, or pointing back at a thing or a place: asks on the last turn's subject
    settled_fact: bool  # asks a fact that does not move with the clock ("how tall", "who designed", "是怎么")
    leaves_medical: bool  # a subject of its own, pointing back at nothing and naming no body or care
    courtesy: bool  # thanks or an acknowledgement, asking nothing
    whole: bool = True  # the user's own words are the whole turn: nothing handed over or quoted


_COURTESY: Final = re.compile(
    r"^(?:(?:(?:ok(?:ay)?|thank you(?: so much| very much)?|thanks?|thx|ty|got it|great|cool|perfect|nice|awesome|"
    r"good to know|appreciate it|bye|goodbye|that helps|makes sense|i see|alright|sure|好|行|嗯|哦)"
    r"(?:[\s,.!。！，、~]+|$))|(?:谢谢|多谢|感谢|好的|明白了|知道了|收到|懂了|了解)[\s,.!。！，、~]*)+"
)
# what may follow thanks in a turn that asks nothing: "Thanks, I'll book an appointment."
_PLAN: Final = re.compile(r"^(?:i'll|i will|i'm going to|i am going to|we'll|will do|我会|我先|我去|我再|那我)")
_QUESTION: Final = re.compile(r"[?？]|吗|呢|什么|怎么|为什么|哪|谁|几|多少")
_OPENER: Final = re.compile(
    r"^(?:"
    + whole_words(
        r"and|or|but|so|then|also|plus|what about|how about|what if|same for|same question|same thing|compared"
    )
    + r"|那|那么|还有|再|另外|换成|改成|如果|要是|至于|而且|以及|跟.{0,4}比)"
)
# pointing back at the thing, place or value asked about; a person is pointed at for medical only
# ("What are his main policies?" after an election result asks nothing live)
_POINTS_BACK: Final = re.compile(
    whole_words(r"it|its|it's|that|that's|those|these|they|them|their|there|instead|too|either|else|ones?|the same")
    + r"|呢$|它|那边|那里|那儿|这边|这里|这个|那个|这些|那些|这样|那样|这种|那种|刚才|上面|前面"
    + r"|(?:比|跟|和|与)(?:上|昨|前|去|之前|刚才|早上)"
)
_POINTS_AT_PERSON: Final = re.compile(whole_words(r"he|she|him|her|his|hers|he's|she's") + r"|他|她")
_SHORT_EN_WORDS: Final = 5
_SHORT_CJK_CHARS: Final = 8
_CJK: Final = re.compile(r"[\u3400-\u9fff]")
_EN_WORD: Final = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
# a capitalised word past the start of a sentence ("Cary Grant", "SSRI"), or Latin letters in a
# Chinese turn ("C语言", "iPhone"); days and months name a moment, not a subject
_NAME_EN: Final = re.compile(r"(?<![.!?]\s)(?<!^)\b(?:[A-Z][a-z]+|[A-Z]{2,})\b")
_NOT_NAMES: Final = frozenset(
    re.findall(
        r"\S+",
        "I I'm I'd I'll I've OK Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March "
        "April May June July August September October November December Celsius Fahrenheit",
    )
)
_LATIN_IN_ZH: Final = re.compile(r"[a-z]")
_TASK: Final = re.compile(
    r"^(?:(?:can|could|would) you |please |now |help me )*"
    + whole_words(
        r"write|draft|compose|translate|rewrite|summari[sz]e|proofread|recommend|suggest|plan|help me plan|"
        r"help me write|tell me a joke|tell me a story|create|generate|implement|code|make me a"
    )
    + r"|帮我写|写一|写个|写篇|写首|翻译|推荐|讲个|讲一个|起个|编一|帮我规划|写代码|给我讲"
)
_TOPIC_CHANGE: Final = re.compile(
    whole_words(
        r"by the way|btw|unrelated|on another note|different question|new question|another question|"
        r"change of topic|changing topics?|switching topics|random question|off topic"
    )
    + r"|换个话题|顺便问一下|顺便问下|另外问一下|另外问个|题外话|问个别的|说点别的|聊点别的"
)
_SETTLED_FACT: Final = re.compile(
    r"^(?:who (?:invented|designed|founded|wrote|built|discovered|directed|created|painted|composed|started)|"
    r"when (?:did|was|were)|how (?:tall|old|big|far|deep|high|wide|heavy|large)|how long (?:is|was|are)|"
    r"how (?:do|does|did) .+ (?:work|form|happen|start)|what (?:is|are|was|were) (?:a|an) |"
    r"what(?:'s| is) the (?:difference|history|meaning|origin|capital)|what does .+ mean|what causes|why do(?:es)? |"
    r"where (?:does|do|did) .+ (?:come from|grow up|originate)|explain|define|tell me (?:about|a fun fact)|"
    r"which country|what(?:'s| is| are) the best |how many times (?:has|have|did|was|were)|"
    r"what (?:\w+ )?(?:does|do) (?:it|they) come with)"
    r"|有多高|有多大|有多长|有多远|有多深|有多重|(?<!还)有多少|是谁|哪一?年|什么时候(?:建|成立|出生|发明)|是什么|"
    r"什么是|怎么形成|如何形成|是怎么|怎么算|怎么读|怎么写|什么意思|有什么区别|的区别|的历史|一共几|一共有|"
    r"(?<!还)有什么(?!优惠|活动|消息|变化|进展|新)|"
    r"有哪些|为什么会|原理|(?:怎么|如何)(?:分辨|区分|辨别|鉴别)|"
    # what a product or a line keeps from day to day: its warranty, its timetable, its top speed
    r"为什么叫|为什么被称为|手续费|退票费|退改规则|售后|保修|质保|几点(?:停运|首班|末班|发车)|首班车|末班车|运营时间|最快能|能开多快|最高时速"
)
# "What is dollar-cost averaging?": a definition moves with no clock, but it may be elliptical
# ("What are alternatives?" to the drug just named), so it ends a realtime carry, not a medical one
_DEFINITION: Final = re.compile(
    r"^what (?:is|are) (?!it|that|this|they|those|these|there|the (?:price|rate|score|weather|temperature))[a-z]"
)
# words of a body or its care: a turn that names one stays on a medical conversation's topic
# even when it is phrased as a question of fact ("What is a migraine?")
_BODY_WORDS: Final = re.compile(
    whole_words(
        r"pain|ache|hurts?|sick|ill|fever|cough|cold|flu|rash|migraines?|headaches?|nausea|symptoms?|"
        r"pills?|tablets?|doses?|drugs?|medicines?|medications?|antibiotics?|doctor|hospital|er|clinic|"
        r"pregnan(?:t|cy)|blood|heart|skin|stomach|infection|allerg(?:y|ic)|"
        r"disease|cancer|diabetes|surgery|x-ray|test|dentist|tooth|teeth"
    )
    + r"|病|症|药|疼|痛|医|炎|癌|血|烧|咳|肿|痒|孕|检查|手术|牙|皮肤"
)


def read_turn(text: str) -> TurnReading:
    """One user turn as written (its capitals name things, its quotes and lines set material apart)."""
    folded = fold(text)
    asked = fold(asked_words(text))
    match = match_folded(folded, asked)
    whole = asked == folded
    if not asked:  # hands material over (a task of its own), or says nothing
        return TurnReading(match, asked, False, False, bool(text.strip()), not text.strip(), whole)
    rest = _COURTESY.sub("", asked).strip()
    if not rest or (rest != asked and _PLAN.search(rest) and not _QUESTION.search(rest)):
        return TurnReading(match, asked, False, False, False, match is None, whole)
    zh = bool(_CJK.search(rest))
    size = len(_CJK.findall(rest)) if zh else len(_EN_WORD.findall(rest))
    short = size <= (_SHORT_CJK_CHARS if zh else _SHORT_EN_WORDS)
    points_back = bool(_OPENER.search(rest) or _POINTS_BACK.search(rest))
    at_person = bool(_POINTS_AT_PERSON.search(rest))
    settled = bool(_SETTLED_FACT.search(rest))
    defined = settled or bool(_DEFINITION.search(rest))
    own_subject = _names(text, zh) or settled or bool(_TASK.search(rest))
    new_topic = bool(_TOPIC_CHANGE.search(rest))
    leans = not new_topic and (points_back or (short and not own_subject and not at_person))
    leaves = new_topic or (own_subject and not (points_back or at_person or _BODY_WORDS.search(rest)))
    return TurnReading(match, asked, leans, defined, leaves, False, whole)


def _names(raw: str, zh: bool) -> bool:
    if zh:
        return bool(_LATIN_IN_ZH.search(_COURTESY.sub("", fold(raw))))
    raw = raw.strip()
    return any(m.group(0) not in _NOT_NAMES for m in _NAME_EN.finditer(raw))


def carried(turns: Sequence[TurnReading]) -> NeverCacheMatch | None:
    """The never-cache intent of the last of a conversation's user turns (oldest first): its own
    rule's, else the one the turns before it carry over to it (the module's docstring)."""
    medical: NeverCacheMatch | None = None  # the medical match the conversation is under
    leaned_on: NeverCacheMatch | None = None  # the other never-cache match of the turn before
    found: NeverCacheMatch | None = None
    for turn in turns:
        if turn.courtesy:
            found = None
            continue
        if medical is not None and turn.leaves_medical:
            medical = None
        if turn.match is not None:
            found = turn.match
        elif medical is not None:
            found = replace(medical, carried=True)
        elif leaned_on is not None and turn.leans and not turn.settled_fact:
            found = replace(leaned_on, carried=True)
        else:
            found = None
        if turn.match is not None and turn.match.intent == MEDICAL:
            medical = turn.match
        leaned_on = found if found is not None and found.intent != MEDICAL else None
    return found
