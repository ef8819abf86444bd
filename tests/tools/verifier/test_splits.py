from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from proxy.tools.verifier.dataset import Splits, build_splits
from proxy.tools.verifier.heldout import eval_rows
from proxy.tools.verifier.pairs import LabeledPair, text_key
from proxy.tools.verifier.splits import split_of, split_pairs
from proxy.verify import PairSide

WEIGHTS = Path(__file__).resolve().parents[2] / "proxy" / "verify" / "weights"


def pair(a: str, b: str, label: int = 1) -> LabeledPair:
    return LabeledPair("toy", PairSide(a), PairSide(b), label)


def test_split_of_is_a_fixed_function_of_seed_and_unit() -> None:
    # pinned: a change here moves rows between train and test and invalidates shipped weights
    assert [split_of(0, u) for u in ("a", "b", "c", "d", "e", "f")] == [
        split_of(0, u) for u in ("a", "b", "c", "d", "e", "f")
    ]
    assert {split_of(0, f"unit-{i}") for i in range(200)} == {"train", "calib", "test"}
    assert [split_of(0, f"u{i}") for i in range(50)] != [split_of(1, f"u{i}") for i in range(50)]


def test_a_text_never_sits_on_both_sides_of_a_split() -> None:
    pairs = [pair(f"q{i}", f"q{i + 1}") for i in range(0, 400, 3)] + [pair(f"x{i}", f"q{i}") for i in range(0, 400, 7)]
    splits = split_pairs(pairs, seed=0)
    seen: dict[str, str] = {}
    for name, rows in splits.items():
        for row in rows:
            for text in (row.a.question, row.b.question):
                assert seen.setdefault(text_key(text), name) == name


def test_split_is_deterministic_and_independent_of_row_order() -> None:
    pairs = [pair(f"问题{i}", f"问题{i}？") for i in range(300)]
    first = split_pairs(pairs, seed=0)
    second = split_pairs(list(reversed(pairs)), seed=0)
    assert {k: sorted(map(repr, v)) for k, v in first.items()} == {k: sorted(map(repr, v)) for k, v in second.items()}


def test_held_out_texts_force_their_whole_component_to_test() -> None:
    pairs = [pair("花呗怎么还款", "花呗如何还款"), pair("花呗如何还款", "花呗还款方式"), pair("借呗额度", "借呗的额度")]
    splits = split_pairs(pairs, seed=0, held_out={text_key("花呗还款方式")})
    assert pairs[0] in splits["test"] and pairs[1] in splits["test"]


@pytest.fixture(scope="module")
def splits(data_dir: Path) -> Splits:
    return build_splits(data_dir, seed=0)


def test_eval_selection_is_reproduced_exactly(data_dir: Path, tmp_path: Path) -> None:
    """Running the trace builder's functions with its seed selects exactly the rows it wrote."""
    eval_dir = data_dir.parent / "eval"
    if not (eval_dir / "dev_traces.jsonl").is_file():
        pytest.skip("no dev_traces.jsonl to compare with")
    written = {
        text_key(t["user"])
        for line in (eval_dir / "dev_traces.jsonl").read_text(encoding="utf-8").splitlines()
        for t in json.loads(line)["turns"]
    }
    shutil.copy(eval_dir / "build_dev_traces.py", tmp_path)  # the builder alone, without its output
    assert eval_rows(data_dir, eval_dir=tmp_path).texts == written


@pytest.mark.slow  # the splits fixture reads every source
def test_no_replay_trace_row_is_trained_or_calibrated_on(splits: Splits) -> None:
    held = splits.held_out
    assert len(held.texts) > 1000  # PAWS-X, QQP, GECOR and KVRET turns
    for name in ("train", "calib"):
        pair_rows = [p for p in splits.rows[name] if not p.source.startswith("mined_")]
        assert not [
            p for p in pair_rows if text_key(p.a.question) in held.texts or text_key(p.b.question) in held.texts
        ]


@pytest.mark.slow  # the splits fixture reads every source
def test_no_traced_dialogue_is_mined_for_training(splits: Splits, data_dir: Path) -> None:
    gecor = json.loads((data_dir / "gecor_camrest676/CamRest676_annotated.json").read_text(encoding="utf-8"))
    kvret = json.loads((data_dir / "cqr_kvret/cqr_kvret_dev_public.json").read_text(encoding="utf-8"))
    traced = {
        f"gecor:{i}"
        for i, d in enumerate(gecor)
        if splits.held_out.holds_dialogue([t["usr"]["transcript"] for t in d["dial"]])
    }
    traced |= {
        f"kvret:{i}"
        for i, d in enumerate(kvret)
        if splits.held_out.holds_dialogue([t["data"]["utterance"] for t in d["dialogue"] if t["turn"] == "driver"])
    }
    assert len(traced) >= 150  # 60 GECOR groups x up to 3 dialogues, 100 KVRET dialogues
    for name in ("train", "calib"):
        dialogues = {
            f"{g.split(':')[0]}:{i}"
            for p in splits.rows[name]
            if p.group
            for g in [p.group]
            for i in g.split(":", 1)[1].split("+")
        }
        assert dialogues and not dialogues & traced, (name, sorted(dialogues & traced)[:5])


@pytest.mark.slow  # the splits fixture reads every source
def test_shipped_manifest_matches_the_split(splits: Splits) -> None:
    from proxy.tools.verifier.dataset import manifest

    path = WEIGHTS / "heldout.json"
    if not path.is_file():
        pytest.skip("no shipped weights yet")
    shipped = json.loads(path.read_text(encoding="utf-8"))
    assert shipped["seed"] == splits.seed
    now = manifest(splits, [], [])["test_sha256"]
    # every set the weights were held out on splits as it did then; a set mined since is one
    # they never read, so its test rows are unseen too
    assert {k: now.get(k) for k in shipped["test_sha256"]} == shipped["test_sha256"]
    trained = set(shipped["trained_rows"]) | set(shipped["calibration_rows"])
    assert not (set(now) - set(shipped["test_sha256"])) & trained
    from proxy.tools.verifier.generated import GENERATORS

    # rows drawn from the training texts themselves: numbers changed, pairs asked in one session,
    # generated near-misses
    derived = {"numbers_changed", "asked_in_session", *GENERATORS}
    assert "numbers_changed" in trained and trained <= set(shipped["counts"]["train"]) | derived


@pytest.mark.slow  # the splits fixture reads every source
def test_next_turn_negatives_pair_a_turn_in_context_with_the_turn_before_it(splits: Splits) -> None:
    rows = [p for name in ("train", "calib", "test") for p in splits.rows[name] if p.source == "mined_next_turn"]
    assert len(rows) > 1000
    assert {p.label for p in rows} == {0}
    for p in rows:
        # the earlier turn is the candidate: the request side reads it as its previous question;
        # the same words twice ("I don't care." about the area, then about the price) differ by context
        assert p.a.previous_question == p.b.question
        assert text_key(p.a.question) != text_key(p.b.question) or p.a.previous_reply_head != p.b.previous_reply_head
    sources = {p.group.split(":")[0] for p in rows}
    assert sources == {"gecor", "crosswoz", "mt_bench"}


@pytest.mark.slow  # the splits fixture reads every source
def test_restated_turns_are_read_as_the_cache_meets_them(splits: Splits) -> None:
    rows = [p for name in ("train", "calib", "test") for p in splits.rows[name] if p.source == "mined_restated"]
    assert len(rows) > 1000
    for p in rows:
        # the candidate is the turn before: the request reads it as its previous question
        assert p.a.previous_question == p.b.question
    positives = [p for p in rows if p.label == 1]
    assert {p.group.split(":")[0] for p in positives} == {"gecor", "kvret", "crosswoz"}
    # a repeat, word for word, after its answer, and a rewrite that spells the turn out
    assert any(text_key(p.a.question) == text_key(p.b.question) for p in positives)
    assert any(len(p.a.question) > len(p.b.question) + 20 for p in positives)
    assert {p.group.split(":")[0] for p in rows if p.label == 0} == {"kvret"}  # the next driver turn


def test_pair_rows_asked_in_one_session_keep_their_label() -> None:
    from proxy.tools.verifier.dataset import asked_in_session

    pairs = [LabeledPair("lcqmc", PairSide(f"q{i}"), PairSide(f"r{i}"), i % 2) for i in range(10)]
    mined = LabeledPair("mined_gecor", PairSide("a", "b"), PairSide("c"), 1, "gecor:1")
    out = asked_in_session([*pairs, mined], random.Random(0), 6)
    assert len(out) == 6 and all(p.source == "asked_in_session" for p in out)
    for p in out:
        i = int(p.b.question[1:])
        assert p.a == PairSide(f"r{i}", f"q{i}") and p.b == PairSide(f"q{i}") and p.label == i % 2


def test_later_sets_split_around_the_first_without_moving_them() -> None:
    from proxy.tools.verifier.splits import LARGE, split_added

    base = split_pairs([pair(f"b{i}", f"b{i}x") for i in range(300)], seed=0)
    before = {name: list(rows) for name, rows in base.items()}
    test_text = base["test"][0].a.question
    calib_text = base["calib"][0].a.question
    added = [pair(test_text, "new-t"), pair(calib_text, "new-c"), *(pair(f"n{i}", f"n{i}y") for i in range(200))]
    # a component past LARGE texts: its rows are assigned one by one, those touching held-out texts left out
    hub = [pair("hub", f"spoke{i}") for i in range(LARGE + 5)] + [pair("spoke0", base["test"][1].a.question)]
    out = split_added(added + hub, 0, base, held_out=["n0"])
    assert base == before
    where = {(p.a.question, p.b.question): name for name, rows in out.items() for p in rows}
    assert where[(test_text, "new-t")] == "test" and where[(calib_text, "new-c")] == "calib"
    assert where[("n0", "n0y")] == "test"
    assert ("spoke0", base["test"][1].a.question) not in where and where[("hub", "spoke3")] == "train"
    assert {"train", "calib", "test"} <= set(where.values())


@pytest.mark.parametrize(
    ("text", "changed", "label"),
    [
        ("为什么我的花呗能用", "为什么我的花呗不能用", 0),
        ("Why can I log in?", "Why can't I log in?", 0),
        ("从北京到上海的高铁多少钱", "从上海到北京的高铁多少钱", 0),
        ("Is Python faster than Java?", "Is Java faster than Python?", 0),
        ("What is the difference between TCP and UDP?", "What is the difference between UDP and TCP?", 1),
    ],
)
def test_generated_pairs_keep_the_words_and_say_whether_the_meaning_moved(text: str, changed: str, label: int) -> None:
    from proxy.tools.verifier.generated import negated, roles_swapped

    rng = random.Random(0)
    assert negated(text, rng) == (changed, label) or roles_swapped(text, rng) == (changed, label)


def test_yes_no_questions_are_not_negated_and_a_place_swap_names_another_place() -> None:
    from proxy.tools.verifier.generated import negated, place_swapped

    rng = random.Random(0)
    assert negated("花呗可以分期吗", rng) is None  # 不可以分期吗 asks the same
    swapped = place_swapped("杭州的天气怎么样", rng)
    assert swapped is not None and swapped[1] == 0 and "杭州" not in swapped[0] and swapped[0].endswith("的天气怎么样")
