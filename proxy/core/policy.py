"""Per-intent risk policies: a YAML file in, frozen objects out, validated at load.

A policy says, per intent, whether answers may be cached and how sure the cache must be before
it serves one. Every intent inherits the ``defaults`` block and overrides what it needs. Any
mistake in the file (unknown key, wrong type, accept below candidate, a pool wider than the
intent allows) is a :class:`PolicyError` naming the file, the dotted key and the fix, so a bad
file fails at start or on reload and never mid-request.
"""

from __future__ import annotations

import difflib
import functools
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from proxy.core.errors import ConfigError
from proxy.core.model import SCOPES, Scope
from proxy.core.policy_values import CONVERTERS, BadValue, Check, JudgeMode, WidenBy, describe, type_name
from proxy.core.policy_yaml import strict_yaml, yaml_reason

GENERAL = "general"

_INTENT_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
# Keys the defaults block must spell out: the safety posture of a policy is never implicit.
_REQUIRED_DEFAULTS = ("cache", "accept", "candidate", "direct_hit", "validate", "ttl", "scope")
_OPTIONAL_DEFAULTS = (
    "widen_to",
    "widen_by",
    "global_safe",
    "feedback_floor",
    "prewarm",
    "restatement",
    "repeats_widen_to",
    "verify_accept",
    "verify_previous",
    "verify_top",
    "judge",
    "judge_top",
    "judge_floor",
    "judge_deadline_ms",
    "judge_verify",
    "judge_near",
    "judge_near_again",
    "judge_near_opening",
    "max_error",
    "audit_rate",
    "labels_per_user",
)
# Keys that once meant something and now do nothing: read with a warning, so old files still load.
_DEPRECATED: Mapping[str, str] = MappingProxyType(
    {"half_hit": "every half-hit forwards the conversation unchanged, with the engine's prefix-cache hints"}
)
_INTENT_ONLY = ("exemplars", "keywords", "force", "neighbours")
_BUILTIN: Mapping[str, Any] = MappingProxyType(
    {
        "global_safe": False,
        "widen_by": "scores",
        "feedback_floor": 0.0,
        "prewarm": False,
        "restatement": False,
        "repeats_widen_to": "session",
        "verify_accept": None,
        "verify_previous": None,
        "verify_top": 3,
        "judge": "off",
        "judge_top": 2,
        "judge_floor": None,
        "judge_deadline_ms": 800,
        "judge_verify": None,
        "judge_near": None,
        "judge_near_again": None,
        "judge_near_opening": None,
        "max_error": None,
        "audit_rate": 0.05,
        "labels_per_user": 50,
        "exemplars": (),
        "keywords": (),
        "force": False,
        "neighbours": frozenset(),
    }
)


class PolicyDeprecation(FutureWarning):
    """A key the policy file still sets but that has no effect any more; says what to do instead."""


class PolicyError(ConfigError, ValueError):
    """A policy file that cannot be used; says where and how to fix it."""

    def __init__(self, file: str, key: str, reason: str) -> None:
        super().__init__(f"{file}: {key}: {reason}")
        self.file = file
        self.key = key
        self.reason = reason


@dataclass(frozen=True)
class IntentPolicy:
    name: str
    cache: bool
    accept: float
    candidate: float
    direct_hit: bool
    validate: tuple[Check, ...]
    ttl: int  # seconds
    scope: Scope  # the pool a new answer is written to
    widen_to: Scope  # the widest pool a lookup may read from
    global_safe: bool
    feedback_floor: float
    prewarm: bool
    # serve the previous turn's answer to its spelled-out restatement (proxy.core.decision.decide); off by default
    restatement: bool
    # None: the accept zone decides. A probability: the pair verifier decides instead, serving the
    # best candidate above `candidate` only when its probability reaches this (proxy.core.decision.decide)
    verify_accept: float | None
    # None: only the words show a restatement. A probability: the session's previous turn is also
    # served to a request the pair verifier reads as that turn asked again (a rewrite, a
    # paraphrase, a repeat) with at least this probability; every later net still runs
    verify_previous: float | None = None
    # "scores": another session's record in the pools above serves as the session's own does.
    # "judge": only on the judge's yes (an exact repeat aside), where the scores, set within
    # sessions, cannot tell another user's near-miss apart ("rated 4.5 or more" / "4 or more")
    widen_by: WidenBy = "scores"
    # how many of the nearest candidates above `candidate` the verifier reads (where verify_accept
    # is set); the one it scores highest that passes every net is served
    verify_top: int = 3
    # the widest pool (session, user or tenant) from which a conversation repeated byte for byte
    # is served the answer the first one got, whatever pool that answer was written to
    # (proxy.service.cache); "session": only the pools above, as for any other request
    repeats_widen_to: Scope = "session"
    # who decides what the scores cannot (docs/architecture.md, "The judge"): "off"; "race": the
    # forward and the judge start together and a yes before `judge_deadline_ms` serves the cached
    # answer; "async": forwarded, and a yes makes the wording an alias of the record for next time
    judge: JudgeMode = "off"
    # how many candidates that passed every net the judge reads, best first
    judge_top: int = 2
    # the score a candidate needs to reach the judge; None: `candidate`
    judge_floor: float | None = None
    # how long a raced forward's first bytes wait for the verdict
    judge_deadline_ms: int = 800
    # None: the judge reads the nearest candidates that passed every net. A probability: the pair
    # verifier reads the nearest `verify_top` of them first, and only those it scores at least this
    # reach the judge, in its order
    judge_verify: float | None = None
    # None: the verifier's level alone admits. A similarity: a candidate whose current turn is at
    # least this near the request's (the question cosine) reaches the judge whatever the verifier
    # scored it, after those it scored at least judge_verify: rewordings it reads as another question
    judge_near: float | None = None
    # None: judge_near. A similarity: the same for a question the session asks again after other
    # turns (both turns name what they ask about): within one conversation a rewording is far likelier
    # the same question than another user's near wording is
    judge_near_again: float | None = None
    # None: judge_near. A similarity: the same for another conversation's opening asked as the
    # candidate's opening was (both first turns naming what they ask about): nothing came before
    # either, so the turns are all there is to compare
    judge_near_opening: float | None = None
    # None: every gray-zone request the judge would read is asked. A rate: where this tenant's labels
    # (verdicts, answer agreement, corrections) bound the wrong answers above a verifier level under
    # it, requests above that level are served without asking (docs/architecture.md, "Learned levels")
    max_error: float | None = None
    # the share of requests served by a learned level that are still judged, and of the judge's yes
    # that are still forwarded and their answers compared, so that drift in either shows
    audit_rate: float = 0.05
    # the labels one end user (or session, where no user is named) may count for a tenant's level
    labels_per_user: int = 50
    exemplars: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()
    force: bool = False
    # the intents whose records this one reads, and which read its own: where the classifier's
    # readings of one request fall either side of a boundary its exemplars draw (one wording read
    # as a shop question, another left unsure and so general), the intent filter does not part
    # them. Declared on either side, held by both; cached intents that serve by the same rule only
    neighbours: frozenset[str] = frozenset()

    @property
    def judge_score_floor(self) -> float:
        return self.candidate if self.judge_floor is None else self.judge_floor

    @property
    def judges(self) -> bool:
        """Does the judge read this intent's gray zone? Never where only exact repeats may serve."""
        return self.cache and self.judge != "off" and self.direct_hit

    @property
    def learns(self) -> bool:
        """Are this intent's judged requests served by a learned level where labels allow?"""
        return self.judges and self.max_error is not None

    @property
    def shares_repeats(self) -> bool:
        """Does an exact repeat reach past the caller's session beyond the pools above?"""
        return self.repeats_widen_to != "session"

    @property
    def pools(self) -> tuple[Scope, ...]:
        """Pools a lookup for this intent may read, narrowest first."""
        return SCOPES[SCOPES.index(self.scope) : SCOPES.index(self.widen_to) + 1]


@dataclass(frozen=True)
class ClassifierSettings:
    min_similarity: float = 0.5
    margin: float = 0.03
    followup_max_chars: int = 12
    # A turn whose intent changed starts a new topic unless it scores at least this against the
    # centroid of the last turns; like every similarity here, it is on the embedding's own scale.
    topic_switch_similarity: float = 0.95
    # the learned never-cache reader (proxy/signing/never_cache_head.py), where weights exist for
    # the embedding pack; off, only the rules and the forcing keywords name never-cache turns
    never_cache_reader: bool = True


@dataclass(frozen=True)
class Policy:
    version: str
    defaults: IntentPolicy
    intents: Mapping[str, IntentPolicy]  # file order, which is the precedence of forced keywords
    classifier: ClassifierSettings = field(default_factory=ClassifierSettings)
    source: str = "<memory>"
    # The embedding pack the thresholds were calibrated under; None: not declared (any pack).
    embedding_model: str | None = None

    @functools.cached_property
    def judges(self) -> bool:
        """Does the judge read any intent's gray zone? Read on every request: computed once."""
        return any(i.judges for i in self.intents.values())

    def for_intent(self, name: str) -> IntentPolicy:
        return self.intents.get(name) or self.intents[GENERAL]


def load_policy(path: Path) -> Policy:
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(source, "(file)", f"cannot read: {exc.strerror or exc}") from exc
    try:
        data = strict_yaml(text)
    except yaml.YAMLError as exc:
        raise PolicyError(source, "(yaml)", f"not valid YAML: {yaml_reason(exc)}") from exc
    if not isinstance(data, Mapping):
        raise PolicyError(
            source, "(top level)", f"expected a mapping with version, defaults and intents, got {type_name(data)}"
        )
    return parse_policy(data, source)


def parse_policy(data: Mapping[str, Any], source: str) -> Policy:
    _only_keys(data, ("version", "embedding_model", "classifier", "defaults", "intents"), "", source)
    version = _required(data, "version", "", source)
    if not isinstance(version, str) or not version.strip():
        raise PolicyError(
            source,
            "version",
            f'expected a non-empty string, got {describe(version)}; quote it, e.g. version: "2024-06-01"',
        )
    defaults = _defaults_block(_section(data, "defaults", source, required=True), source)
    # Built before the intents so a bad default is reported against `defaults`, not its heirs.
    defaults_policy = _build_intent("defaults", defaults, "defaults", source)
    intents = _intents(_section(data, "intents", source, required=True), defaults, source)
    classifier = _classifier(_section(data, "classifier", source, required=False), source)
    model = data.get("embedding_model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise PolicyError(
            source,
            "embedding_model",
            f"expected the name of an embedding pack, got {describe(model)}; e.g. embedding_model: use-multilingual",
        )
    return Policy(version.strip(), defaults_policy, intents, classifier, source, model.strip() if model else None)


def check_embedding_model(policy: Policy, model: str, *, shipped_fallback: bool = False) -> None:
    """Thresholds are cosines on one model's scale: consecutive turns of a conversation have a
    median cosine of about 0.9 under e5 and 0.6 under USE. A policy calibrated under another model
    would serve or refuse by the wrong numbers. ``shipped_fallback``: no policy was set and none is
    shipped for this model, so the default one was tried."""
    if policy.embedding_model is None or policy.embedding_model == model:
        return
    calibrate = f"smartcache calibrate TRACES --embedding-model {model} --out FILE"
    if shipped_fallback:
        raise PolicyError(
            policy.source,
            "embedding_model",
            f"no policy is shipped for embedding model "
            f"'{model}', and the default one was calibrated for '{policy.embedding_model}'; "
            f"similarity scales differ between models. Calibrate one ({calibrate}) and set "
            f"policy: FILE, or run with embedding_model: {policy.embedding_model}",
        )
    raise PolicyError(
        policy.source,
        "embedding_model",
        f"this policy was calibrated for "
        f"'{policy.embedding_model}' but the cache embeds with '{model}'; similarity scales "
        f"differ between models. Leave `policy` unset to use the one shipped for the pack, "
        f"calibrate one ({calibrate}), or run with embedding_model: {policy.embedding_model}",
    )


def _defaults_block(block: Mapping[str, Any], source: str) -> dict[str, Any]:
    block = _without_deprecated(block, "defaults", source)
    for key in block:
        if key in _INTENT_ONLY:
            raise PolicyError(source, f"defaults.{key}", "set per intent only; move it under intents.<name>")
    _only_keys(block, _REQUIRED_DEFAULTS + _OPTIONAL_DEFAULTS, "defaults", source)
    for key in _REQUIRED_DEFAULTS:
        _required(block, key, "defaults", source)
    return {key: _coerce(key, value, f"defaults.{key}", source) for key, value in block.items()}


def _intents(block: Mapping[str, Any], defaults: Mapping[str, Any], source: str) -> Mapping[str, IntentPolicy]:
    resolved: dict[str, IntentPolicy] = {}
    for name, body in block.items():
        where = f"intents.{name}"
        if not isinstance(name, str) or not _INTENT_NAME.match(name):
            raise PolicyError(
                source,
                where,
                "intent names are lower-case letters, digits and '_', starting with a letter (at most 40 characters)",
            )
        if body is None:
            body = {}
        if not isinstance(body, Mapping):
            raise PolicyError(source, where, f"expected a mapping of settings, got {describe(body)}")
        body = _without_deprecated(body, where, source)
        _only_keys(body, _REQUIRED_DEFAULTS + _OPTIONAL_DEFAULTS + _INTENT_ONLY, where, source)
        own = {key: _coerce(key, value, f"{where}.{key}", source) for key, value in body.items()}
        resolved[name] = _build_intent(name, {**defaults, **own}, where, source)
    if GENERAL not in resolved:
        raise PolicyError(
            source,
            f"intents.{GENERAL}",
            "missing; every policy needs a 'general' intent, the fallback for turns no other intent claims",
        )
    _check_forced_keywords(resolved, source)
    return MappingProxyType(_with_neighbours(resolved, source))


def _without_deprecated(block: Mapping[str, Any], where: str, source: str) -> Mapping[str, Any]:
    for key in block.keys() & _DEPRECATED.keys():
        message = f"{source}: {_join(where, key)}: has no effect and is ignored ({_DEPRECATED[key]}); remove it"
        warnings.warn(PolicyDeprecation(message), stacklevel=4)
    return {k: v for k, v in block.items() if k not in _DEPRECATED}


def _build_intent(name: str, merged: Mapping[str, Any], where: str, source: str) -> IntentPolicy:
    values = {**_BUILTIN, "widen_to": merged["scope"], **merged}
    if values["accept"] < values["candidate"]:
        raise PolicyError(
            source,
            f"{where}.accept",
            f"accept ({values['accept']}) is below candidate "
            f"({values['candidate']}); accept must be >= candidate: raise accept or lower "
            "candidate",
        )
    _check_pools(values, where, source)
    if values["force"] and not values["keywords"]:
        raise PolicyError(
            source,
            f"{where}.force",
            "force: true needs at least one keyword to force on; add keywords or set force: false",
        )
    if where != "defaults" and name != GENERAL and not values["exemplars"] and not values["keywords"]:
        raise PolicyError(
            source,
            f"{where}.exemplars",
            "the intent has neither exemplars nor keywords, so "
            "the classifier can never choose it; add exemplar utterances",
        )
    return IntentPolicy(name=name, **values)


def _check_pools(values: Mapping[str, Any], where: str, source: str) -> None:
    scope, widen_to = values["scope"], values["widen_to"]
    if scope == "global" and not values["global_safe"]:
        raise PolicyError(
            source,
            f"{where}.scope",
            "scope 'global' shares answers across tenants and "
            "needs global_safe: true; set it only for answers proven safe for everyone, "
            "else use 'tenant'",
        )
    if SCOPES.index(widen_to) < SCOPES.index(scope):
        raise PolicyError(
            source,
            f"{where}.widen_to",
            f"widen_to '{widen_to}' is narrower than scope "
            f"'{scope}', so the intent could never read its own answers; set widen_to to "
            f"'{scope}' or wider",
        )
    if widen_to == "global" and not values["global_safe"]:
        raise PolicyError(
            source,
            f"{where}.widen_to",
            "widen_to 'global' serves answers across tenants and "
            "needs global_safe: true; set it only for answers proven safe for everyone, "
            "else widen to 'tenant'",
        )


def _with_neighbours(intents: Mapping[str, IntentPolicy], source: str) -> dict[str, IntentPolicy]:
    """Each intent with its neighbours declared on either side. A neighbour's record is served
    under the request's intent, so both must be cached and serve by the same rule (a record of an
    intent that serves exact repeats alone must not be served by meaning through another); a
    forced intent is kept apart by its keywords on purpose (请假 and 投诉 e-mails)."""
    held: dict[str, set[str]] = {name: set() for name in intents}
    for intent in intents.values():
        for other in sorted(intent.neighbours):
            where = f"intents.{intent.name}.neighbours"
            if other not in intents:
                hint = difflib.get_close_matches(other, list(intents), n=1)
                fix = f"did you mean '{hint[0]}'?" if hint else "name an intent this policy defines"
                raise PolicyError(source, where, f"unknown intent {other!r}; {fix}")
            _check_neighbours(intent, intents[other], where, source)
            held[intent.name].add(other)
            held[other].add(intent.name)
    return {name: replace(intent, neighbours=frozenset(held[name])) for name, intent in intents.items()}


def _check_neighbours(one: IntentPolicy, other: IntentPolicy, where: str, source: str) -> None:
    if one.name == other.name:
        raise PolicyError(source, where, "an intent is not its own neighbour; remove it from the list")
    for intent in (one, other):
        if not intent.cache:
            raise PolicyError(
                source, where, f"'{intent.name}' is never cached, so it has no records to share; remove it"
            )
        if intent.force:
            raise PolicyError(
                source,
                where,
                f"'{intent.name}' is forced by its keywords, which keep it apart from every other intent; "
                "remove it or set force: false",
            )
    if one.direct_hit != other.direct_hit:
        raise PolicyError(
            source,
            where,
            f"'{one.name}' and '{other.name}' differ in direct_hit, so a record one serves only as an exact "
            "repeat would be served by meaning through the other; pair intents that serve by the same rule",
        )


def _check_forced_keywords(intents: Mapping[str, IntentPolicy], source: str) -> None:
    # Two forcing intents sharing a keyword would make the file order decide silently.
    owner: dict[str, str] = {}
    for intent in intents.values():
        if not intent.force:
            continue
        for keyword in intent.keywords:
            folded = keyword.casefold()
            if folded in owner:
                raise PolicyError(
                    source,
                    f"intents.{intent.name}.keywords",
                    f"keyword {keyword!r} also "
                    f"forces intent '{owner[folded]}'; a forced keyword must belong to one "
                    "intent",
                )
            owner[folded] = intent.name


def _classifier(block: Mapping[str, Any], source: str) -> ClassifierSettings:
    _only_keys(
        block,
        ("min_similarity", "margin", "followup_max_chars", "topic_switch_similarity", "never_cache_reader"),
        "classifier",
        source,
    )
    values = {key: _coerce(key, value, f"classifier.{key}", source) for key, value in block.items()}
    return ClassifierSettings(**values)


def _coerce(key: str, value: Any, where: str, source: str) -> Any:
    try:
        return CONVERTERS[key](value)
    except BadValue as bad:
        raise PolicyError(source, where, str(bad)) from None


def _only_keys(block: Mapping[str, Any], allowed: tuple[str, ...], where: str, source: str) -> None:
    for key in block:
        if key not in allowed:
            hint = difflib.get_close_matches(str(key), allowed, n=1)
            fix = f"did you mean '{hint[0]}'?" if hint else f"expected one of: {', '.join(allowed)}"
            raise PolicyError(source, _join(where, str(key)), f"unknown key; {fix}")


def _required(block: Mapping[str, Any], key: str, where: str, source: str) -> Any:
    if key not in block:
        raise PolicyError(source, _join(where, key), "missing; this key is required")
    return block[key]


def _section(data: Mapping[str, Any], key: str, source: str, *, required: bool) -> Mapping[str, Any]:
    value = _required(data, key, "", source) if required else data.get(key, {})
    if value is None and not required:
        return {}
    if not isinstance(value, Mapping) or (required and not value):
        raise PolicyError(source, key, f"expected a non-empty mapping, got {describe(value)}")
    return value


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key
