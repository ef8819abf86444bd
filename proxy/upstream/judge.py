"""The judge: the model behind the proxy asked whether a cached answer answers a new request
(docs/architecture.md, "The judge").

The protocol: ``POST /chat/completions`` with ``x-smartcache-judge: 1``; the new request's messages
unchanged, then the cached answer as an assistant turn, then the judge question; one or two tokens
at temperature 0 (``logprobs`` where the engine reports them). The conversation's prefix is the
request's own, so an engine's prefix cache serves its prefill. A reply whose first word is not yes
is a no: a judge that rambles decides nothing.

Calls are capped (``max_concurrent``): over the cap there is no verdict, and the request is a
miss, so a slow judge costs hits, never latency or a queue. Its tokens are counted apart from the
answers' (``JudgeCounts``).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from proxy.core.errors import UpstreamError
from proxy.upstream.client import Upstream

__all__ = ["EXPECT_HEADER", "JUDGE_HEADER", "JUDGE_QUESTION", "Judge", "JudgeCounts", "judge_body", "read_verdict"]

JUDGE_HEADER = "x-smartcache-judge"
EXPECT_HEADER = "x-smartcache-expect"
JUDGE_QUESTION = (
    "Look at your last reply above. Is it a correct and complete answer to the message I sent just "
    "before it, in this conversation? Answer with one word: yes or no."
)
_FIRST_WORD = re.compile(r"[A-Za-z]+|[是否对不]")
_YES = frozenset({"yes", "是", "对"})


def judge_body(messages: Sequence[Mapping[str, Any]], answer: str, model: str, *, logprobs: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": JUDGE_QUESTION}],
        "max_tokens": 2,
        "temperature": 0,
        "stream": False,
    }
    if logprobs:
        body["logprobs"] = True
        body["top_logprobs"] = 2
    return body


def read_verdict(body: Any) -> bool:
    """Yes only when the reply's first word is yes; anything else (no, a sentence, an empty or
    malformed reply) is a no."""
    try:
        content = body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return False
    word = _FIRST_WORD.search(content) if isinstance(content, str) else None
    return word is not None and word.group(0).lower() in _YES


@dataclass
class JudgeCounts:
    """What judging cost and said, for ``/metrics`` and ``stats``."""

    calls: int = 0
    yes: int = 0
    no: int = 0
    failed: int = 0  # an error, a timeout
    skipped: int = 0  # over the concurrency cap: no call made
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0


class Judge:
    def __init__(
        self,
        upstream: Upstream,
        *,
        model: str | None = None,
        max_concurrent: int = 8,
        timeout: float = 5.0,
        logprobs: bool = True,
    ) -> None:
        """``upstream``: the app's own client, or one for a judge URL of its own; ``model``: the
        judge's model, None for the request's own."""
        self.upstream, self.model, self.timeout, self.logprobs = upstream, model, timeout, logprobs
        self.max_concurrent = max_concurrent
        self.in_flight = 0
        self.counts = JudgeCounts()
        self.exam_counts = JudgeCounts()

    async def verdict(
        self,
        messages: Sequence[Mapping[str, Any]],
        answer: str,
        *,
        model: str,
        headers: Mapping[str, str],
        expect: bool | None = None,
    ) -> bool | None:
        """Does ``answer`` answer the last of ``messages``? None: no verdict (the cap, an error, the
        timeout). ``expect``: an exam question's right verdict, sent in a header a model ignores."""
        if self.in_flight >= self.max_concurrent:
            self.counts.skipped += 1
            return None
        counts = self.counts if expect is None else self.exam_counts
        sent = {**headers, JUDGE_HEADER: "1" if expect is None else "exam"}
        if expect is not None:
            sent[EXPECT_HEADER] = "yes" if expect else "no"
        body = judge_body(messages, answer, self.model or model, logprobs=self.logprobs)
        self.in_flight += 1
        t = time.perf_counter()
        try:
            got = await asyncio.wait_for(self.upstream.chat_json(body, sent), self.timeout)
        except (UpstreamError, TimeoutError) as exc:
            counts.failed += 1
            structlog.get_logger("smartcache").info("judge.failed", error=type(exc).__name__)
            return None
        finally:
            self.in_flight -= 1
            counts.seconds += time.perf_counter() - t
        counts.calls += 1
        usage = got.body.get("usage") if isinstance(got.body, dict) else None
        if isinstance(usage, dict):
            counts.prompt_tokens += int(usage.get("prompt_tokens") or 0)
            counts.completion_tokens += int(usage.get("completion_tokens") or 0)
        yes = read_verdict(got.body)
        if yes:
            counts.yes += 1
        else:
            counts.no += 1
        return yes
