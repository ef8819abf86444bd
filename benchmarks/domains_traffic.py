"""The traffic of benchmarks/bench_domains.py, pure: question pools in, sessions out, and for each
request the answer it deserves, what it is (new, follow-up, near miss, or which kind of repeat) and
which earlier request it waits for. No IO but reading the pool file.

The pools (benchmarks/data/domains_pool.yaml) are written by hand: question groups in the ways
different users put them, near misses that share their words but ask something else, follow-ups
that only mean something after the previous answer. A tenant has TENANT_SESSIONS sessions, each in
one language, one user a session; a larger run has more tenants, so the mix holds at every size.
"""

from __future__ import annotations

import collections
import hashlib
import json
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

POOL = Path(__file__).resolve().parent / "data" / "domains_pool.yaml"
DOMAINS = ("support", "travel", "shopping", "code", "chitchat", "general")
LANGS = ("en", "zh")
SYSTEM_PROMPT = "You are a helpful assistant. Answer in the user's language. 请用用户的语言回答。"
TENANT_SESSIONS = 40  # sessions of one tenant: a larger run has more tenants, not larger ones

# by construction: the shares below give about a fifth of requests close to an earlier one
LENGTHS = (2, 3, 3, 4, 4, 5, 5, 6, 7)  # requests in a session
OPEN_VERBATIM, OPEN_REWORDED, OPEN_NEAR = 0.14, 0.22, 0.10  # how a session opens (else new)
P_EDIT, P_REASK, P_FOLLOW, P_NEAR = 0.08, 0.08, 0.25, 0.08  # each later turn (else new)

KINDS = {  # kind -> (label, close to an earlier request)
    "new": ("new", False),
    "followup": ("follow-up", False),
    "near_miss": ("near miss", False),
    "reask": ("re-asked in other words", True),
    "edit": ("edited and re-sent", True),
    "faq_other": ("another user, other words", True),
    "exact_other": ("another user, same words", True),  # the whole conversation, byte for byte
    "chance": ("asked again by chance", True),
}
_SLOT = re.compile(r"\{([a-z_]+?)(2?)(?:\.(\d))?\}")
_TOKEN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]|[A-Za-z0-9]+|[^\sA-Za-z0-9\u3400-\u9fff\uf900-\ufaff]")
_SENTENCE = re.compile(r"^(.+?[.!?。！？])(\s|$)", re.S)


def tokens(text: str) -> int:
    """An estimate: a CJK character, a word or a punctuation mark is one token."""
    return len(_TOKEN.findall(text))


def prompt_tokens(messages: Sequence[Mapping[str, str]]) -> int:
    return sum(tokens(m["content"]) + 4 for m in messages)


# --- the pools ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    domain: str
    gid: str
    lang: str
    asks: tuple[str, ...]
    answer: str
    contrasts: tuple[tuple[str, str], ...]  # (wording, answer): near misses of other meaning

    @property
    def slot_names(self) -> tuple[str, ...]:
        texts = [*self.asks, self.answer, *(t for pair in self.contrasts for t in pair)]
        return tuple(sorted({m.group(1) + m.group(2) for t in texts for m in _SLOT.finditer(t)}))


Forms = tuple[str, ...]  # the written forms of one slot value: ("3", "three")


@dataclass(frozen=True)
class Pool:
    groups: Mapping[tuple[str, str], tuple[Group, ...]]  # (domain, lang) ->
    slots: Mapping[tuple[str, str], Mapping[str, tuple[Forms, ...]]]  # (domain, lang) -> slot ->
    followups: Mapping[str, Mapping[str, tuple[tuple[str, ...], str]]]  # lang -> kind -> (texts, answer)


def load_pool(path: Path = POOL) -> Pool:
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    groups: dict[tuple[str, str], list[Group]] = collections.defaultdict(list)
    slots: dict[tuple[str, str], dict[str, tuple[Forms, ...]]] = {}
    for domain in DOMAINS:
        spec = raw["domains"][domain]
        for lang in LANGS:
            slots[domain, lang] = {
                name: tuple((v,) if isinstance(v, str) else tuple(v) for v in values)
                for name, values in spec["slots"][lang].items()
            }
        for g in spec["groups"]:
            contrasts = tuple((c["ask"], c["answer"]) for c in g.get("contrast", ()))
            group = Group(domain, g["id"], g["lang"], tuple(g["ask"]), g["answer"], contrasts)
            missing = [n for n in group.slot_names if n.rstrip("2") not in slots[domain, group.lang]]
            if missing:
                raise ValueError(f"{path}: {domain}/{group.gid} uses slots {missing} the domain does not define")
            groups[domain, group.lang].append(group)
    followups = {
        lang: {kind: (tuple(f["texts"]), f["answer"]) for kind, f in raw["followups"][lang].items()} for lang in LANGS
    }
    return Pool({k: tuple(v) for k, v in groups.items()}, slots, followups)


@dataclass(frozen=True)
class Question:
    """One instance of a group: its slot values, or one of its contrasts (``contrast`` >= 0)."""

    group: Group
    values: tuple[tuple[str, Forms], ...]
    contrast: int = -1

    @property
    def answer_id(self) -> str:
        own = "" if self.contrast < 0 else f"~{self.contrast}"
        filled = ",".join(f"{k}={v[0]}" for k, v in self.values)
        return f"{self.group.domain}/{self.group.gid}{own}|{filled}"

    @property
    def wordings(self) -> tuple[str, ...]:
        return self.group.asks if self.contrast < 0 else (self.group.contrasts[self.contrast][0],)

    def render(self, template: str, rng: random.Random | None) -> str:
        """The template with slot values; with ``rng``, a value of several forms takes any of them
        (a user's text), without it the first (the answer's text)."""
        values = dict(self.values)

        def fill(m: re.Match[str]) -> str:
            forms = values[m.group(1) + m.group(2)]
            if m.group(3) is not None:
                return forms[int(m.group(3))]
            return rng.choice(forms) if rng is not None else forms[0]

        return _SLOT.sub(fill, template)

    def answer(self) -> str:
        template = self.group.answer if self.contrast < 0 else self.group.contrasts[self.contrast][1]
        return self.render(template, None)


def sample_values(
    names: Iterable[str], lists: Mapping[str, tuple[Forms, ...]], rng: random.Random, keep: Mapping[str, Forms] = {}
) -> tuple[tuple[str, Forms], ...]:
    """A value for each slot (``keep``'s where given); ``x2`` and ``x`` never take the same value."""
    chosen = {name: keep[name] for name in names if name in keep}
    for name in names:
        if name not in chosen:
            twin = name[:-1] if name.endswith("2") else name + "2"
            chosen[name] = rng.choice([v for v in lists[name.rstrip("2")] if v != chosen.get(twin)])
    return tuple(sorted(chosen.items()))


# --- the traffic -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    text: str
    answer_id: str
    kind: str
    replaces_last: bool = False  # an edit: sent in the previous turn's place, on the same history


@dataclass(frozen=True)
class Asked:
    """A question as one request put it: which wording, so a near miss can keep the words."""

    question: Question
    wording: int
    request: Request


@dataclass(frozen=True)
class Session:
    domain: str
    lang: str
    index: int  # in its domain
    requests: tuple[Request, ...]

    @property
    def tenant(self) -> str:
        return f"sk-bench-{self.domain}-{self.index // TENANT_SESSIONS}"

    @property
    def sid(self) -> str:
        return f"{self.domain}-{self.index}"


def slight_edit(text: str, lang: str, rng: random.Random) -> str:
    """The same message typed again with a small change, as a user edits and re-sends it."""
    edits: list[Callable[[str], str]]
    if lang == "zh":
        edits = [
            lambda t: "请问" + t if not t.startswith("请问") else t[2:],
            lambda t: t.rstrip("？?") + "，谢谢",
            lambda t: t[:-1] + "?" if t.endswith("？") else t.rstrip("?") + "？",
            lambda t: "麻烦问一下，" + t,
        ]
    else:
        edits = [
            lambda t: re.sub(r"([?.!]?)$", lambda m: " please" + m.group(1), t, count=1),
            lambda t: t.lower() if t != t.lower() else t.capitalize(),
            lambda t: t.rstrip("?.!") if t[-1:] in "?.!" else t + "?",
            lambda t: "Quick question: " + t[:1].lower() + t[1:],
            lambda t: t + " thanks",
        ]
    for edit in rng.sample(edits, len(edits)):
        edited = edit(text)
        if edited != text and edited.strip():
            return edited
    return text + "!"


def first_sentence(answer: str) -> str:
    body = answer.split("\n")[0].strip()
    m = _SENTENCE.match(body)
    return m.group(1) if m else body


class TenantTraffic:
    """The sessions of one domain's tenant, in the order they start."""

    def __init__(self, pool: Pool, domain: str, rng: random.Random, answers: dict[str, str]) -> None:
        self.pool, self.domain, self.rng, self.answers = pool, domain, rng, answers
        self.seen: set[str] = set()  # answer ids the tenant has asked for so far
        self.openings: dict[str, list[Asked]] = {lang: [] for lang in LANGS}  # earlier sessions' first questions

    def session(self, index: int) -> Session:
        lang = self.rng.choice(LANGS)
        opening = self._opening(lang)
        self.openings[lang].append(opening)
        requests, asked = [opening.request], [opening]
        for _ in range(self.rng.choice(LENGTHS) - 1):
            request, question = self._next(requests, asked, lang)
            requests.append(request)
            if question is not None:
                asked.append(question)
        self.seen.update(r.answer_id for r in requests)
        return Session(self.domain, lang, index, tuple(requests))

    def _opening(self, lang: str) -> Asked:
        earlier, r = self.openings[lang], self.rng.random()
        if earlier and r < OPEN_VERBATIM:
            a = self.rng.choice(earlier)
            return Asked(a.question, a.wording, Request(a.request.text, a.request.answer_id, "exact_other"))
        if earlier and r < OPEN_VERBATIM + OPEN_REWORDED:
            a = self.rng.choice(earlier)
            if len(a.question.wordings) > 1:
                return self.ask(a.question, "faq_other", avoid=[a.request.text])
        elif earlier and r < OPEN_VERBATIM + OPEN_REWORDED + OPEN_NEAR:
            near = self.near_miss(self.rng.choice(earlier), lang)
            if near is not None:
                return near
        return self.ask(self.new_question(lang), "new")

    def _next(self, requests: list[Request], asked: list[Asked], lang: str) -> tuple[Request, Asked | None]:
        last, r = requests[-1], self.rng.random()
        if asked[-1].request is last and not last.replaces_last and r < P_EDIT:
            a = asked[-1]
            edited = Request(slight_edit(last.text, lang, self.rng), last.answer_id, "edit", replaces_last=True)
            return edited, Asked(a.question, a.wording, edited)
        r -= P_EDIT
        earlier = [a for a in asked if a.request is not last and len(a.question.wordings) > 1]
        if earlier and r < P_REASK:
            again = self.ask(self.rng.choice(earlier).question, "reask", avoid=[x.text for x in requests])
            return again.request, again
        r -= P_REASK
        if r < P_FOLLOW:
            return self.followup(last, lang), None
        r -= P_FOLLOW
        if r < P_NEAR and (near := self.near_miss(self.rng.choice(asked), lang)) is not None:
            return near.request, near
        new = self.ask(self.new_question(lang), "new")
        return new.request, new

    def new_question(self, lang: str) -> Question:
        """A question the tenant has not asked yet, if 40 draws find one (else a chance repeat)."""
        for _ in range(40):
            group = self.rng.choice(self.pool.groups[self.domain, lang])
            q = Question(group, sample_values(group.slot_names, self.pool.slots[self.domain, lang], self.rng))
            if q.answer_id not in self.seen:
                break
        return q

    def near_miss(self, a: Asked, lang: str) -> Asked | None:
        """The same words with another meaning: one slot value changed, or the group's contrast."""
        q, lists = a.question, self.pool.slots[self.domain, lang]
        values = dict(q.values)
        options = [
            Question(q.group, sample_values(values, lists, self.rng, {k: v for k, v in values.items() if k != name}))
            for name in values
            if q.contrast < 0
        ]
        if q.contrast < 0:
            options += [Question(q.group, q.values, c) for c in range(len(q.group.contrasts))]
        fresh = [o for o in options if o.answer_id not in self.seen and o.answer_id != q.answer_id]
        if not fresh:
            return None
        near = self.rng.choice(fresh)
        return self.ask(near, "near_miss", wording=a.wording if near.contrast < 0 else 0)

    def ask(self, q: Question, kind: str, wording: int | None = None, avoid: Sequence[str] = ()) -> Asked:
        """``q`` in one of its wordings (``wording``, or any whose text is not in ``avoid``)."""
        order = [wording] if wording is not None else self.rng.sample(range(len(q.wordings)), len(q.wordings))
        for i in order:
            text = q.render(q.wordings[i], self.rng)
            if text not in avoid:
                break
        self.answers.setdefault(q.answer_id, q.answer())
        return Asked(q, i, Request(text, q.answer_id, kind))

    def followup(self, previous: Request, lang: str) -> Request:
        kind = self.rng.choice(sorted(self.pool.followups[lang]))
        texts, template = self.pool.followups[lang][kind]
        answer_id = f"{previous.answer_id}>{kind}"
        core = first_sentence(self.answers[previous.answer_id])
        self.answers.setdefault(answer_id, template.replace("{core}", core))
        return Request(self.rng.choice(texts), answer_id, "followup")


# --- the plan: sessions, what each request deserves, what it waits for --------------------------

Pos = tuple[int, int]  # (session, request) in Plan.sessions


@dataclass(frozen=True)
class Plan:
    sessions: tuple[Session, ...]
    answers: Mapping[str, str]  # answer id -> the answer's text
    codes: Mapping[str, str]  # answer id -> the letters the oracle tags it with
    tenants: Mapping[str, str]  # tenant key -> the letters the oracle tags its answers with
    kinds: Mapping[Pos, str]  # what each request is, as realised (a planned new one may repeat)
    after: Mapping[Pos, tuple[Pos, ...]]  # a repeat -> the tenant's first of its answer and of its words
    oracle: Mapping[str, str]  # prompt key (system prompt and user turns) -> answer id

    def tag(self, answer_id: str, tenant: str) -> str:
        return f"{self.codes[answer_id]}:{self.tenants.get(tenant, 'zzzz')}"

    def deserved(self, pos: Pos) -> str:
        s = self.sessions[pos[0]]
        return self.tag(s.requests[pos[1]].answer_id, s.tenant)

    def order(self) -> list[int]:
        """The order sessions start in: domains and tenants interleaved, each tenant's in its order."""

        def key(i: int) -> tuple[int, int, str]:
            s = self.sessions[i]
            return (s.index % TENANT_SESSIONS, s.index // TENANT_SESSIONS, s.domain)

        return sorted(range(len(self.sessions)), key=key)


def prompt_key(system: str, users: Sequence[str]) -> str:
    return hashlib.sha1(json.dumps([system, *users], ensure_ascii=False).encode()).hexdigest()


def user_turns(session: Session) -> list[tuple[str, ...]]:
    """Each request's user turns, as its messages carry them (an edit replaces the last)."""
    users: tuple[str, ...] = ()
    out = []
    for r in session.requests:
        users = (*users[: -1 if r.replaces_last else None], r.text)
        out.append(users)
    return out


def letters(n: int) -> str:
    """A tag of letters only, so no answer validation reads a number into it."""
    out = ""
    for _ in range(4):
        n, d = divmod(n, 26)
        out = chr(97 + d) + out
    return out


def realised_kind(planned: str, repeat: bool, verbatim: bool) -> str:
    """What a request turned out to be: a conversation the tenant already sent byte for byte is a
    verbatim repeat whatever was planned (another user may have picked the same wording), and a
    request planned as new whose answer the tenant already had is a repeat by chance."""
    if verbatim:
        return "exact_other"
    if repeat and not KINDS[planned][1]:
        return "chance"
    return planned


def build_plan(pool: Pool, per_domain: int, seed: int) -> Plan:
    answers: dict[str, str] = {}
    sessions: list[Session] = []
    for domain in DOMAINS:
        for start in range(0, per_domain, TENANT_SESSIONS):
            traffic = TenantTraffic(pool, domain, random.Random(f"{seed}/{domain}/{start}"), answers)
            sessions += [traffic.session(i) for i in range(start, min(per_domain, start + TENANT_SESSIONS))]
    kinds: dict[Pos, str] = {}
    after: dict[Pos, tuple[Pos, ...]] = {}
    first: dict[tuple[str, str], Pos] = {}
    sent: dict[tuple[str, tuple[str, ...]], Pos] = {}  # (tenant, user turns) -> its first request
    oracle: dict[str, str] = {}
    for si, s in enumerate(sessions):  # per tenant, in the order its sessions were drawn
        for j, (r, users) in enumerate(zip(s.requests, user_turns(s), strict=True)):
            key = prompt_key(SYSTEM_PROMPT, users)
            if oracle.setdefault(key, r.answer_id) != r.answer_id:
                raise AssertionError(f"one conversation, two answers: {users} -> {oracle[key]}, {r.answer_id}")
            prior = first.setdefault((s.tenant, r.answer_id), (si, j))
            if KINDS[r.kind][1] and prior == (si, j):
                raise AssertionError(f"{s.sid} request {j} is a {r.kind} of nothing earlier")
            same_words = sent.setdefault((s.tenant, users), (si, j))
            kinds[si, j] = realised_kind(r.kind, prior != (si, j), same_words != (si, j))
            if prior != (si, j):
                after[si, j] = tuple(sorted({prior, same_words} - {(si, j)}))
    codes = {a: letters(i) for i, a in enumerate(sorted(answers))}
    tenants = {t: letters(i) for i, t in enumerate(sorted({s.tenant for s in sessions}))}
    return Plan(tuple(sessions), answers, codes, tenants, kinds, after, oracle)


def mix(plan: Plan) -> dict[str, int]:
    counts = collections.Counter(plan.kinds.values())
    return {k: counts.get(k, 0) for k in KINDS}
