"""What a signature costs the embedding model: one call per request, whatever the history, and
a second only for a topic switch, whose view differs from the one built in advance; a request
re-sent as it was costs neither the model nor the tagger. And what a request costs the segmenter
and the model's tokenizer: each text cut once, from signing to the decision, and the view counted
once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from proxy.core.identity import Identity
from proxy.core.model import Signature
from proxy.core.openai.request import ChatRequest, parse_chat_request
from proxy.core.text.normalize import Segmenter, default_segmenter, normalize_text
from proxy.embedding.backends import SyncEmbedder
from proxy.observability.metrics import Metrics
from proxy.service.compose import NOWHERE, Parts, open_parts
from proxy.settings import load_settings

TURNS = (
    "I need a hotel in Cambridge for two nights",
    "There are 33 hotels. Do you have an area in mind?",
    "Somewhere in the centre, with free parking",
    "The Gonville Hotel is central and has free parking.",
    # on the hotel, by name: the default pack's exemplars read "Does it have wifi?" as realtime, a
    # topic switch, and these tests are about a conversation that keeps its topic
    "Does the hotel have wifi?",
)


def counted(parts: Parts, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []
    embed = parts.signer.embedder.embed

    async def counting(texts: Sequence[str], **kw: Any) -> Any:
        calls.append(list(texts))
        return await embed(texts, **kw)

    monkeypatch.setattr(parts.signer.embedder, "embed", counting)
    return calls


def chat(turns: Sequence[str]) -> ChatRequest:
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]
    return parse_chat_request(orjson.dumps({"model": "m", "messages": msgs}))


async def sign(parts: Parts, turns: Sequence[str]) -> Signature:
    return await parts.signer.sign(chat(turns))


async def test_each_turn_of_a_conversation_costs_one_model_call(
    parts: Parts, monkeypatch: pytest.MonkeyPatch, sync_embedder: SyncEmbedder
) -> None:
    calls = counted(parts, monkeypatch)
    for end in (1, 3, 5):
        before = len(calls)
        sig = await sign(parts, TURNS[:end])
        assert len(calls) == before + 1, calls[before:]
        alone = np.asarray(sync_embedder.embed([sig.view_text])[0], dtype=np.float32)
        # the view's vector, embedded beside the question, is the one it has alone (up to the int8
        # pack's activations, quantised per call: a vector moves up to ~1e-3 with its companions)
        assert float(sig.vector @ (alone / np.linalg.norm(alone))) > 0.995
    assert calls[-1][0] == "does the hotel have wifi" and calls[-1][-1].endswith("user: does the hotel have wifi")


async def test_a_topic_switch_embeds_its_own_view_in_a_second_call(
    parts: Parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    await sign(parts, TURNS[:3])
    monkeypatch.setattr(parts.signer, "_is_topic_switch", lambda *args: True)
    calls = counted(parts, monkeypatch)
    sig = await sign(parts, (*TURNS[:4], "Write me a haiku about the sea"))
    assert len(calls) == 2
    assert sig.tags.context_switch and "hotel" not in sig.view_text.lower()
    assert calls[1] == [sig.view_text]


async def test_a_request_resent_signs_from_memory_until_the_policy_is_reloaded(
    parts: Parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await sign(parts, TURNS[:3])
    calls = counted(parts, monkeypatch)
    classified: list[str] = []
    classify = parts.signer.classifier.classify

    def counting(text: Any, vector: Any, **kw: Any) -> Any:
        classified.append(str(text))
        return classify(text, vector, **kw)

    monkeypatch.setattr(parts.signer.classifier, "classify", counting)
    again = await sign(parts, TURNS[:3])
    assert again is first and calls == [] and classified == []  # neither the model nor the tagger
    # one character more, another system version asserted: each a signature of its own
    other = await sign(parts, (*TURNS[:2], TURNS[2] + "!"))
    assert other is not first and classified
    req = parse_chat_request(
        orjson.dumps({"model": "m", "messages": [{"role": "user", "content": t} for t in TURNS[:1]]})
    )
    assert await parts.signer.sign(req, system_version="v9") is not await parts.signer.sign(req)
    # a reloaded policy (admin.reload sets the classifier) tags anew
    parts.signer.classifier = parts.signer.classifier
    classified.clear()
    fresh = await sign(parts, TURNS[:3])
    assert fresh is not first and classified
    assert (fresh.tags, fresh.view_text, fresh.request_hash) == (first.tags, first.view_text, first.request_hash)


WORDS = [
    "apple",
    "river",
    "mountain",
    "violin",
    "garden",
    "bicycle",
    "harbor",
    "pepper",
    "castle",
    "museum",
    "jacket",
    "candle",
    "forest",
]


async def test_a_conversation_first_seen_long_embeds_its_view_and_only_the_latest_user_turns_it_dropped(
    parts: Parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 60 turns of ~40 words, far past the view's budget; seen for the first time (a restart, or a
    # client that sends its history): each dropped turn embedded would cost seconds
    history = [f"turn{i} " + " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(40)) for i in range(60)]
    monkeypatch.setattr(parts.signer, "_is_topic_switch", lambda *args: False)  # one view, the one kept
    calls = counted(parts, monkeypatch)
    sig = await sign(parts, (*history, "And which one was the oldest?"))
    embedder, budget = parts.signer.embedder, parts.signer.view_budget
    assert len(calls) == 1
    sent = calls[0]
    assert embedder.count_tokens(sig.view_text) <= budget
    # the view keeps the latest turns that fit: one more turn back would not
    kept = int(sig.view_text.split(" ", 2)[1].removeprefix("turn"))
    assert embedder.count_tokens(f"user: {history[kept - 1]}\n{sig.view_text}") > budget
    # the chunks are the 8 latest user turns dropped, as each was asked: the same texts as the 3
    # recent user turns the intent is read from, which the call carries anyway
    chunks = {f"turn{i}" for i in [i for i in range(kept) if i % 2 == 0][-8:]}
    recent = {"turn54", "turn56", "turn58"}
    turns_sent = [t.split(" ", 1)[0] for t in sent if t.startswith("turn")]
    assert sorted(turns_sent) == sorted(chunks | recent)  # each once
    assert len(sent) == 1 + len(turns_sent) + 1  # the question, those user turns, the view
    assert len(chunks - recent) >= 5


async def test_the_next_turn_of_a_long_conversation_embeds_only_its_question_and_view(
    parts: Parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what a turn drops out of the view was asked before: its vector is known
    history = [f"turn{i} " + " ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(40)) for i in range(20)]
    monkeypatch.setattr(parts.signer, "_is_topic_switch", lambda *args: False)
    first = await sign(parts, (*history, "And which one was the oldest?"))
    calls = counted(parts, monkeypatch)
    sig = await sign(parts, (*history, "And which one was the oldest?", "The first one.", "Why that one?"))
    assert calls == [["why that one", sig.view_text]]
    assert sig.view_text != first.view_text


async def test_the_app_builds_its_own_segmenter_at_start_and_reads_every_text_with_it(
    tmp_path: Path, sync_embedder: SyncEmbedder, model_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # jieba's dictionary takes over a second to build: inside a request, every fresh process's
    # first one paid it on the event loop. And it is the app's: nothing the app serves reaches for
    # the process-wide default, signing, deciding or keeping an answer's key facts
    built: list[Segmenter] = []
    init = Segmenter.__init__

    def building(self: Segmenter) -> None:
        built.append(self)
        init(self)

    monkeypatch.setattr(Segmenter, "__init__", building)
    default = default_segmenter.cache_info()
    settings = load_settings(
        environ={},
        overrides={"data_dir": tmp_path, "model_home": model_home, "ready_after": 0.0, "upstream": NOWHERE},
    )
    who = Identity(tenant="t", session="s1", user=None, session_explicit=True)
    async with open_parts(settings, upstream_url=NOWHERE, metrics=Metrics(), backend=sync_embedder) as parts:
        assert len(built) == 1
        for turns in (
            ["那家酒店的早餐怎么样？"],
            ["那家酒店的早餐怎么样？", "早餐七点开始，在三楼。", "早餐几点开始？"],
        ):
            plan = await parts.planner.plan(chat(turns), who)
            assert plan.signature is not None and plan.policy is not None
            await parts.cache.write(
                request=chat(turns), who=who, sig=plan.signature, policy=plan.policy, policy_version="v",
                answer="早餐七点开始，在三楼，杭州本地菜为主。", usage={},
            )  # fmt: skip
        assert plan.decision is not None and plan.decision.record is not None  # the guards read a candidate
        assert len(built) == 1
    assert default_segmenter.cache_info()[:2] == default[:2]  # neither built nor asked for


async def test_view_tokens_caps_what_a_view_embeds_and_the_older_turns_count_as_chunks(
    parts: Parts, tmp_path: Path, sync_embedder: SyncEmbedder, model_home: Path
) -> None:
    # a view's cost grows with its length: a deployment trades older context for latency
    whole = await sign(parts, TURNS)
    settings = load_settings(
        environ={"SMARTCACHE_VIEW_TOKENS": "64"},
        overrides={"data_dir": tmp_path, "model_home": model_home, "upstream": "http://127.0.0.1:9/v1"},
    )
    async with open_parts(settings, upstream_url=NOWHERE, metrics=Metrics(), backend=sync_embedder) as capped:
        embedder = capped.signer.embedder
        assert (await sign(capped, TURNS[:1])).view_text == (await sign(parts, TURNS[:1])).view_text
        sig = await sign(capped, TURNS)
        assert embedder.count_tokens(sig.view_text) <= 64 < embedder.count_tokens(whole.view_text)
        assert "cambridge" in whole.view_text and "cambridge" not in sig.view_text
        assert sig.view_text.endswith(
            "user: does the hotel have wifi\nuser: does the hotel have wifi"
        )  # the question stays
        # the dropped turns still pull the vector: it is not the vector of the view's text alone
        [view_only] = await capped.signer.vectors([sig.view_text])
        assert float(sig.vector @ view_only) < 0.999


def test_view_tokens_below_a_useful_view_is_refused() -> None:
    with pytest.raises(ValueError, match="view_tokens"):
        load_settings(environ={"SMARTCACHE_VIEW_TOKENS": "10"})


async def test_a_long_system_prompt_leaves_the_view_to_the_conversation(parts: Parts) -> None:
    # answers under another system prompt are kept apart by the index filter; in the view the
    # prompt only anchors, and a whole one would take the 128-token budget from the turns
    system = "You are the booking assistant of a hotel chain. " * 40 + "Answer in English."
    msgs = [{"role": "system", "content": system}] + [
        {"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(TURNS)
    ]
    sig = await parts.signer.sign(parse_chat_request(orjson.dumps({"model": "m", "messages": msgs})))
    head = sig.view_text.split("\n", 1)[0]
    assert head.startswith("system: ") and head.endswith("answer in english")
    assert len(head) <= len("system: ") + parts.signer.settings.system_tail_chars
    assert "user: somewhere in the centre, with free parking" in sig.view_text
    assert parts.signer.embedder.count_tokens(sig.view_text) <= parts.signer.view_budget


# A Chinese paraphrase of the session's previous, elliptical turn: the signer reads it for a
# restatement and the decision for reordered words, and both read its words and the previous turn's
ELLIPTICAL = "杭州三天怎么玩？"
PARAPHRASE = "杭州三天怎么玩比较好？"
ELLIPTICAL_ANSWER = "第一天游西湖，第二天去灵隐寺，第三天逛西溪湿地。"


async def test_a_turn_is_cut_once_from_signing_to_the_decision(
    tmp_path: Path, sync_embedder: SyncEmbedder, model_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = load_settings(
        environ={},
        overrides={"data_dir": tmp_path, "model_home": model_home, "ready_after": 0.0, "upstream": NOWHERE},
    )
    who = Identity(tenant="t", session="s1", user=None, session_explicit=True)
    async with open_parts(settings, upstream_url=NOWHERE, metrics=Metrics(), backend=sync_embedder) as parts:
        first = chat([ELLIPTICAL])
        plan = await parts.planner.plan(first, who)
        assert plan.signature is not None and plan.policy is not None
        await parts.cache.write(
            request=first, who=who, sig=plan.signature, policy=plan.policy, policy_version="v",
            answer=ELLIPTICAL_ANSWER, usage={},
        )  # fmt: skip
        cuts: Counter[tuple[str, str]] = Counter()
        for how in ("words", "tag"):
            cut = getattr(Segmenter, how)

            def counting(self: Segmenter, text: Any, cut: Any = cut, how: str = how) -> Any:
                cuts[how, text if isinstance(text, str) else "".join(text)] += 1
                return cut(self, text)

            monkeypatch.setattr(Segmenter, how, counting)
        backend = parts.signer.embedder.backend
        counted_tokens: Counter[str] = Counter()
        count_tokens = backend.count_tokens

        def counting_tokens(text: str) -> int:
            counted_tokens[text] += 1
            return count_tokens(text)

        monkeypatch.setattr(backend, "count_tokens", counting_tokens)
        plan = await parts.planner.plan(chat([ELLIPTICAL, ELLIPTICAL_ANSWER, PARAPHRASE]), who)
    assert plan.signature is not None and plan.decision is not None
    assert plan.decision.record is not None and plan.decision.stage == "lexical_guards", plan.decision
    current = plan.signature.current_text
    # the paraphrase, as written (normalising reads its numerals) and normalised (for its words, and
    # its entities); the reply as written, normalised for the view. Each cut once. The previous
    # turn's words, read for a restatement and as the candidate's question, are not cut again:
    # they were when it was asked
    assert max(cuts.values()) == 1, cuts
    assert ("words", current) in cuts and ("words", normalize_text(ELLIPTICAL)) not in cuts
    # the entities read the words of that one cut, tagged, not a second cut by the tagger; the view
    # fits, so the reply's entities, read only to choose what a view drops, are not read
    assert {text for how, text in cuts if how == "tag"} == {current}
    assert list(counted_tokens.values()) == [1], counted_tokens  # the view, counted once
