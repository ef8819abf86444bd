"""Replay, calibration and warm-up on small fixed traces of our own."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from proxy.core.decision.decide import RESTATEMENT
from proxy.core.policy import load_policy
from proxy.embedding.backends import SyncEmbedder
from proxy.settings import DEFAULT_POLICY, load_settings
from proxy.storage.sqlite import SqliteStore
from proxy.tools.calibrate import calibrate, describe_kept, samples_needed, upper_bound
from proxy.tools.calibrated_policy import write_policy
from proxy.tools.datasets.traces import Conversation, Turn
from proxy.tools.held_out import fold_of, held_out
from proxy.tools.replay import Row, run_replay, summarize
from proxy.tools.warm import WarmTarget, warm

SYSTEM = "You are a helpful assistant."


def conv(cid: str, *turns: Turn, tenant: str = "t1") -> Conversation:
    return Conversation(id=cid, category="fixture", tenant=tenant, session=cid, system=SYSTEM, turns=turns)


TRACE = [
    # an exact repeat right after: the same key, a hit
    conv(
        "repeat",
        Turn("What is the tallest mountain in Europe?", "K-everest", "Mount Elbrus."),
        Turn("What is the tallest mountain in Europe?", "K-everest"),
    ),
    # a realtime question is never cached, even repeated
    conv(
        "weather",
        Turn("What's the weather in Paris right now?", "K-w1", "Sunny.", expect="no_hit"),
        Turn("What's the weather in Paris right now?", "K-w1", expect="no_hit"),
    ),
    # another tenant asks the same: its own miss
    conv("other", Turn("What is the tallest mountain in Europe?", "K-everest"), tenant="t2"),
]


def row(intent: str, score: float | None, ok: bool, *, nets: bool = True) -> Row:
    return Row("c", "cat", 0, intent, "shadow_hit", "accept", score, ok, nets, False, ok, ok, 0)


async def test_replay_counts_on_a_fixed_trace(sync_embedder: SyncEmbedder, model_home: Path, tmp_path: Path) -> None:
    settings = load_settings(environ={}, overrides={"data_dir": tmp_path, "model_home": model_home})
    rows = await run_replay(TRACE, settings=settings, backend=sync_embedder)
    by = {(r.conversation, r.turn): r for r in rows}
    assert by[("repeat", 1)].status == "hit" and not by[("repeat", 1)].false_hit
    assert by[("repeat", 1)].saved_tokens > 0
    assert by[("weather", 0)].status == by[("weather", 1)].status == "bypass"
    assert by[("other", 0)].status == "miss"
    totals = summarize(rows, lambda r: "all")["all"]
    assert (totals["requests"], totals["hit"], totals["false_hits"], totals["bypass"]) == (5, 1, 0, 2)


async def test_shadow_replay_records_candidates_without_serving(
    sync_embedder: SyncEmbedder, model_home: Path, tmp_path: Path
) -> None:
    settings = load_settings(environ={}, overrides={"data_dir": tmp_path, "model_home": model_home})
    rows = await run_replay(TRACE, settings=settings, backend=sync_embedder, shadow=True)
    repeat = next(r for r in rows if (r.conversation, r.turn) == ("repeat", 1))
    assert repeat.status == "shadow_hit" and repeat.nets_ok and repeat.candidate_key_ok
    assert repeat.score is not None and repeat.score > 0.9
    assert not any(r.status == "hit" for r in rows)


TEMPLATE = load_policy(DEFAULT_POLICY)


def test_calibrate_keeps_the_template_where_thin_data_cannot_show_the_target() -> None:
    """Issue 38.4: 13 requests once set accept 0.8 for five intents, some with no sample at all,
    and 'How can I reset my router password?' was then served the account-password answer."""
    rows = [row("general", 0.95, True)] * 8 + [row("chitchat", 0.9, True)] * 3 + [row("travel", 0.85, False)] * 2
    rows += [row("shopping", None, True, nets=False)] * 2  # no sample: no candidate passed the nets
    results = calibrate(rows, template=TEMPLATE, target=1e-3)
    assert set(results) == {"general", "chitchat", "travel", "shopping"}
    for intent, c in results.items():
        kept = TEMPLATE.for_intent(intent)
        assert not c.fitted and (c.accept, c.candidate) == (kept.accept, kept.candidate)
        assert f"kept the template's accept {kept.accept:g}" in c.note and "2995" in c.note
    assert "2 false candidates score at or above it" in results["travel"].note
    warning = describe_kept(results)
    assert warning is not None and "4 of 4 intents" in warning and "shopping" in warning


def test_a_kept_intent_is_written_as_the_template_had_it(tmp_path: Path) -> None:
    rows = [row("general", 0.95, True)] * 8 + [row("travel", 0.85, False)] * 5
    out = tmp_path / "calibrated.yaml"
    write_policy(DEFAULT_POLICY, out, calibrate(rows, template=TEMPLATE), traces=["thin.jsonl"], target=1e-3)
    written = load_policy(out)
    for intent in ("general", "travel"):
        assert written.for_intent(intent).accept == TEMPLATE.for_intent(intent).accept
        assert written.for_intent(intent).candidate == TEMPLATE.for_intent(intent).candidate
    assert "# travel: 5 samples; thresholds left as they were" in out.read_text(encoding="utf-8")


def test_calibrate_fits_the_lowest_threshold_whose_upper_bound_meets_the_target() -> None:
    rows = [row("chitchat", 0.90 + (i % 50) / 1000, True) for i in range(4000)] + [row("chitchat", 0.85, False)]
    result = calibrate(rows, target=1e-3, floor=0.8, min_samples=5)["chitchat"]
    assert result.fitted and result.false_hits == 0 and result.fhr_upper <= 1e-3
    assert result.accept == pytest.approx(0.90, abs=0.001) and result.note.startswith("meets target")
    # a false candidate at 0.9035: counted in, no threshold's bound meets 1e-3 (1 in 4001 bounds at
    # 1.1e-3), so the lowest that does sits just above it, where 3680 right ones remain
    one_false = [*rows, row("chitchat", 0.9035, False)]
    fitted = calibrate(one_false, target=1e-3, floor=0.8, min_samples=5)["chitchat"]
    assert fitted.fitted and fitted.fhr_upper <= 1e-3 and fitted.accept == pytest.approx(0.904)
    # above a false at 0.93 too few remain to show the target: nothing is fitted
    high_false = calibrate([*rows, row("chitchat", 0.93, False)], target=1e-3, min_samples=5)["chitchat"]
    assert not high_false.fitted


def test_ties_at_the_threshold_all_count() -> None:
    # a threshold of 0.97 admits the 3 false candidates at 0.97 with the 60 right ones there: the
    # 160 right ones alone would meet 3 %, all 163 do not
    rows = [row("travel", 0.99, True)] * 100 + [row("travel", 0.97, True)] * 60 + [row("travel", 0.97, False)] * 3
    result = calibrate(rows, target=0.03, min_samples=5)["travel"]
    assert result.accept == pytest.approx(0.99) and result.false_hits == 0


def test_a_thin_intent_takes_the_pooled_threshold_and_never_below_its_own_false_candidate() -> None:
    rows = [row("general", 0.90 + (i % 100) / 1000, True) for i in range(8000)]
    rows += [row("chitchat", 0.97, True)] * 3 + [row("chitchat", 0.92, False)]
    results = calibrate(rows, template=TEMPLATE, target=1e-3)
    pooled = results["general"].accept  # 1 false in the thousands above it still meets 1e-3
    assert results["general"].fitted and pooled < 0.92
    chitchat = results["chitchat"]
    assert chitchat.fitted and chitchat.accept == pytest.approx(0.925) and chitchat.false_hits == 0
    assert "only 4 samples: the threshold fitted on all 8004 together" in chitchat.note
    # a thin intent whose pooled data cannot show the target keeps the template's threshold
    thin = calibrate([*rows[-4:], *rows[:100]], template=TEMPLATE, target=1e-3)["chitchat"]
    assert not thin.fitted and thin.accept == TEMPLATE.for_intent("chitchat").accept


def test_restatements_take_no_part_in_choosing_thresholds() -> None:
    rows = [row("travel", 0.97 + (i % 3) / 100, True) for i in range(200)] + [row("travel", 0.90, False)]
    plain = calibrate(rows, target=0.02, min_samples=5)["travel"]
    # a restatement is served by rule at whatever score; a false one at 0.95 must not move travel's
    # threshold, and its samples are the score-judged candidates only
    restated = dataclasses.replace(row("travel", 0.95, False), reason=RESTATEMENT)
    with_rule = calibrate([*rows, restated], target=0.02, min_samples=5)["travel"]
    assert plain.fitted and (with_rule.accept, with_rule.samples, with_rule.false_hits) == (plain.accept, 201, 0)
    # the held-out check counts it as served, so a false restatement shows there
    assert held_out([*rows, restated], target=0.02, min_samples=5).false_hits == 1


def test_held_out_check_serves_each_fold_with_thresholds_it_did_not_shape() -> None:
    names = [f"c{i}" for i in range(400)]
    fold0 = [n for n in names if fold_of(n, 2) == 0]
    fold1 = [n for n in names if fold_of(n, 2) == 1]

    def at(conv: str, intent: str, score: float, ok: bool) -> Row:
        return dataclasses.replace(row(intent, score, ok), conversation=conv)

    rows = [at(n, "travel", 0.975 + (i % 3) / 100, True) for i, n in enumerate(names)]
    rows += [at(fold0[0], "travel", 0.95, False), at(fold1[0], "travel", 0.97, False)]
    result = held_out(rows, folds=2, target=0.02, min_samples=5)
    # each fold alone fits 0.975 (its own false scores below it), so fold 1's false at 0.97 stays
    # out; within a fold the bound at 0.95 would not meet 2 % once its false is counted
    assert result.false_hits == 0 and result.hits == 400
    # served at the template's accept, what calibration could not fit
    thin = held_out(rows[:50], template=TEMPLATE, folds=2, target=1e-3, min_samples=5)
    assert thin.hits == sum(r.score is not None and r.score >= TEMPLATE.for_intent("travel").accept for r in rows[:50])


def test_upper_bound_is_the_rule_of_three_for_no_failures() -> None:
    assert upper_bound(0, 3000) == pytest.approx(1 - 0.05 ** (1 / 3000))
    assert upper_bound(0, 3000) < 1e-3 < upper_bound(0, 2000)
    assert upper_bound(5, 100) > 0.05
    assert samples_needed(1e-3) == 2995 and upper_bound(0, 2995) <= 1e-3 < upper_bound(0, 2994)


def test_calibrated_policy_file_loads_and_records_its_data(tmp_path: Path) -> None:
    rows = [row("travel", 0.99, True), row("travel", 0.95, False)] + [row("travel", 0.97, True)] * 200
    out = tmp_path / "calibrated.yaml"
    write_policy(DEFAULT_POLICY, out, calibrate(rows, target=0.02, min_samples=5), traces=["fixture.jsonl"],
                 target=0.02)  # fmt: skip
    policy = load_policy(out)
    assert policy.intents["travel"].accept == pytest.approx(0.97)
    text = out.read_text(encoding="utf-8")
    assert "fixture.jsonl" in text and "# travel: 202 samples" in text


async def test_warm_twice_writes_each_record_once(
    sync_embedder: SyncEmbedder, model_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import proxy.service.compose

    async def shared_backend(_settings: object) -> SyncEmbedder:
        return sync_embedder

    monkeypatch.setattr(proxy.service.compose, "load_backend", shared_backend)
    past = [
        conv(
            "past-1",
            Turn("Recommend a book about databases", "K1", "Designing Data-Intensive Applications."),
            Turn("And one about compilers?", "K2", "Crafting Interpreters."),
        ),
        conv("past-2", Turn("How do I boil an egg?", "K3", "Ten minutes in boiling water.")),
    ]
    settings = load_settings(environ={}, overrides={"data_dir": tmp_path, "model_home": model_home})
    assert await warm(past, settings, target=WarmTarget(model="m")) == (3, 0)
    assert await warm(past, settings, target=WarmTarget(model="m")) == (0, 3)
    store = await SqliteStore.open(settings.db_path)
    try:
        records = [r async for r in store.iter_live()]
    finally:
        await store.close()
    assert len(records) == 3 and {r.state for r in records} == {"ready"}


@pytest.mark.slow
def test_calibrate_command_writes_a_stamped_policy_and_a_held_out_check(
    tmp_path: Path, model_home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from proxy.cli import main
    from proxy.tools.datasets.traces import write_traces

    traces = tmp_path / "traces.jsonl"
    write_traces(traces, TRACE)
    out = tmp_path / "cal.yaml"
    monkeypatch.setenv("SMARTCACHE_MODEL_HOME", str(model_home))
    monkeypatch.setenv("SMARTCACHE_DATA_DIR", str(tmp_path / "data"))
    # the command configures the process's logging once, for good; the other tests capture logs
    monkeypatch.setattr("proxy.cli.configure_logging", lambda level="info": None)
    assert main(["calibrate", str(traces), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "held-out check (2-fold by conversation" in printed and "0 false" in printed
    policy = load_policy(out)
    assert policy.embedding_model == load_settings(environ={}).embedding_model
    assert policy.intents["general"].accept >= 0.8
