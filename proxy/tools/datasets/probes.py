"""Hand-written probes: realtime questions and regenerates, which must never be served."""

from __future__ import annotations

import random
import re
from pathlib import Path

from proxy.tools.datasets.traces import EN_SYSTEM, ZH_SYSTEM, Conversation, Draft, consistent

# --- hand-written probes ----------------------------------------------------------------------

_REALTIME = (
    ("What's the weather in Berlin right now?", "How is the weather in Berlin at the moment?"),
    ("What time is it in Tokyo now?", "Tell me the current time in Tokyo."),
    ("What is the Bitcoin price right now?", "How much is one bitcoin worth at this moment?"),
    ("What are today's top news headlines?", "Give me the latest headlines from today."),
    ("What's the USD to EUR exchange rate today?", "How many euros does one US dollar buy today?"),
    ("Is traffic on the Bay Bridge heavy right now?", "How bad is the Bay Bridge traffic at the moment?"),
    ("What's the score of the Lakers game right now?", "Who is winning the Lakers game currently?"),
    ("现在北京几点了？", "北京现在是几点钟？"),
    ("今天上海的天气怎么样？", "上海今天天气如何？"),
    ("今天美元兑人民币的汇率是多少？", "现在一美元能换多少人民币？"),
    ("今天有哪些最新的科技新闻？", "给我说说今天的科技新闻头条。"),
    ("今天是几月几号？", "今天的日期是什么？"),
)
_REGENERATE = (
    ("Write a two-line poem about autumn leaves.", "Crimson leaves let go, / the year exhales in gold."),
    ("Suggest a name for a small coffee shop by the sea.", 'How about "Tide & Bean"?'),
    ("Give me an opening line for a mystery novel.", "The clock in the hall had stopped at 3:17, again."),
    ("给我讲一个关于程序员的冷笑话。", "程序员为什么分不清万圣节和圣诞节？因为 Oct 31 == Dec 25。"),
    ("帮我想一句生日祝福语，送给同事。", "愿你新的一岁工作顺心，生活常有惊喜！"),
)


def _system_for(text: str) -> str:
    return ZH_SYSTEM if re.search(r"[\u4e00-\u9fff]", text) else EN_SYSTEM


def _realtime_pair(n: int, question: str, paraphrase: str) -> list[Conversation]:
    first, later = Draft(_system_for(question)), Draft(_system_for(question))
    k = first.ask(question, expect="no_hit")
    first.ask(paraphrase, key=k, expect="no_hit")
    later.ask(question, key=k, expect="no_hit")
    return [
        first.done(f"realtime-{n}", "realtime_handwritten", "cal-realtime"),
        later.done(f"realtime-{n}-later", "realtime_handwritten", "cal-realtime"),
    ]


def _regenerate_pair(n: int, question: str, answer: str) -> list[Conversation]:
    first, again = Draft(_system_for(question)), Draft(_system_for(question))
    k = first.ask(question, answer=answer)
    again.ask(question, key=k)  # a hit here is right: it was answered in the first conversation
    again.ask(question, key=k, expect="no_hit", regenerate=True)
    return [
        first.done(f"regenerate-{n}", "regenerate_handwritten", "cal-realtime"),
        again.done(f"regenerate-{n}-again", "regenerate_handwritten", "cal-realtime"),
    ]


def realtime_probes(data_dir: Path, rng: random.Random, limit: int) -> list[Conversation]:
    """Realtime questions (asked, paraphrased, asked again later: all expect no_hit) and a regenerate
    after a cacheable question answered in an earlier conversation. Hand-written: no data, no rng."""
    units = [_realtime_pair(n, *qp) for n, qp in enumerate(_REALTIME)]
    for n, qa in enumerate(_REGENERATE):
        units.insert(2 * n + 1, _regenerate_pair(n, *qa))  # interleaved, so a small limit has both
    return consistent([c for unit in units for c in unit][:limit])
