from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from proxy.tools.datasets.build import CONVERTERS, build_traces, main
from proxy.tools.datasets.traces import (
    Conversation,
    TraceError,
    Turn,
    check_traces,
    load_traces,
    prefix_key,
    write_traces,
)

DATA = Path(__file__).resolve().parents[4] / "shared" / "data"
DEV = DATA.parent / "eval" / "dev_traces.jsonl"
pytestmark = pytest.mark.skipif(not DATA.is_dir(), reason=f"evaluation data not at {DATA}")

SOURCES = {  # converter -> the categories it may emit (each names its data)
    "qqp_pairs": {"qqp_session", "qqp_tenant"},
    "pawsx_pairs": {"pawsx_session", "pawsx_tenant"},
    "zh_calib_pairs": {"zh_calib_session", "zh_calib_tenant"},
    "gecor_followups": {"camrest_followup"},
    "gecor_openings": {"camrest_opening"},
    "kvret_rewrites": {"kvret_rewrite"},
    "crosswoz_dialogues": {"crosswoz_dialogue", "crosswoz_repeat"},
    "mtbench_followups": {"mtbench_en", "mtbench_zh", "mtbench101"},
    "realtime_probes": {"realtime_handwritten", "regenerate_handwritten"},
}


def norm(text: str) -> str:
    return " ".join(text.split()).casefold()


@pytest.fixture(scope="module")
def small() -> dict[str, list[Conversation]]:
    return {name: fn(DATA, random.Random(7), 10) for name, fn in CONVERTERS.items()}


def test_every_converter_is_listed() -> None:
    assert set(CONVERTERS) == set(SOURCES)


@pytest.mark.slow  # reads the evaluation data in full
def test_openings_are_one_dialogue_each_keyed_by_their_own_words() -> None:
    convs = CONVERTERS["gecor_openings"](DATA, random.Random(3), 300)
    assert len({c.id for c in convs}) == len(convs) and len({c.tenant for c in convs}) == 1
    assert all(len(c.turns) == 2 for c in convs)
    # a reworded opening is another key: only the same words asked again share one
    by_key: dict[str, set[str]] = {}
    for c in convs:
        by_key.setdefault(c.turns[0].key, set()).add(norm(c.turns[0].user))
    assert all(len(texts) == 1 for texts in by_key.values())
    assert len(by_key) > len(convs) // 2


@pytest.mark.slow  # reads the evaluation data in full
def test_the_default_build_leaves_the_openings_out() -> None:
    # the calibrated policies were fitted on the default build: a converter added since must not change it
    categories = {c.category for c in build_traces(DATA, limit=4)}
    assert "camrest_opening" not in categories
    assert categories >= {"camrest_followup", "crosswoz_dialogue", "kvret_rewrite"}
    assert {c.category for c in build_traces(DATA, names=["gecor_openings"], limit=4)} == {"camrest_opening"}


@pytest.mark.slow  # reads the evaluation data in full
@pytest.mark.parametrize("name", sorted(SOURCES))
def test_converter_output_is_well_formed_and_deterministic(name: str, small: dict[str, list[Conversation]]) -> None:
    convs = small[name]
    assert 3 <= len(convs) <= 10
    assert check_traces(convs) == []
    assert {c.category for c in convs} <= SOURCES[name]
    assert len({c.tenant for c in convs}) == 1
    assert len({c.session for c in convs}) == len(convs)
    for c in convs:
        assert c.turns and all(t.user.strip() and t.key.startswith("K") for t in c.turns)
        assert Conversation.from_json(json.loads(json.dumps(c.to_json()))) == c
    assert CONVERTERS[name](DATA, random.Random(7), 10) == convs
    if name != "realtime_probes":  # hand-written, takes no sample
        assert CONVERTERS[name](DATA, random.Random(8), 10) != convs


@pytest.mark.slow  # reads the evaluation data in full
@pytest.mark.parametrize(("name", "labels_of"), [("pawsx_pairs", "pawsx"), ("qqp_pairs", "qqp")])
def test_pair_keys_follow_the_labels(name: str, labels_of: str, small: dict[str, list[Conversation]]) -> None:
    if labels_of == "pawsx":
        rows = [ln.split("\t") for ln in (DATA / "pawsx_zh" / "PAWSX.valid.tsv").read_text("utf-8").splitlines()]
        label = {(r[0].strip(), r[1].strip()): int(r[2]) for r in rows if len(r) == 3}
    else:
        label = {}
        for f in sorted((DATA / "gptcache_similar_qqp").glob("*.part0[1-3].jsonl")):
            for ln in f.read_text("utf-8").splitlines():
                r = json.loads(ln)
                label[(r["text_a"].strip(), r["text_b"].strip())] = int(r["label"])
    convs = {c.id: c for c in small[name]}
    pairs = [(c.turns[0], c.turns[1], "session") for c in convs.values() if c.category.endswith("_session")]
    pairs += [(c.turns[0], convs[c.id[:-1] + "b"].turns[0], "tenant") for c in convs.values() if c.id.endswith("-a")]
    seen: Counter[tuple[str, int]] = Counter()
    for a, b, framing in pairs:
        lab = label[(a.user, b.user)]
        assert (a.key == b.key) == (lab == 1), (a.user, b.user)
        seen[(framing, lab)] += 1
    assert set(seen) == {("session", 0), ("session", 1), ("tenant", 0), ("tenant", 1)}


@pytest.mark.slow  # reads the evaluation data in full
def test_pair_converters_skip_the_texts_the_shipped_verifier_trained_on() -> None:
    from proxy.tools.datasets.pairs import verifier_trained
    from proxy.tools.verifier.pairs import text_key

    trained = verifier_trained(DATA)
    assert len(trained) > 10000  # the split is real: most pair texts are training texts
    for name in ("pawsx_pairs", "qqp_pairs"):
        convs = CONVERTERS[name](DATA, random.Random(1), 120)
        assert len(convs) == 120
        assert not {text_key(t.user) for c in convs for t in c.turns} & trained


def test_dialogue_converters_skip_the_dialogues_the_shipped_verifier_mined() -> None:
    from proxy.tools.datasets.pairs import verifier_trained_dialogue
    from proxy.tools.verifier.mining import MINED_SETS

    trained = verifier_trained_dialogue()
    openings: dict[tuple[str, ...], bool] = {}  # a dialogue's first two user turns -> trained on?

    def keep(dialogue: str, user_turns: list[str]) -> bool:
        opening = tuple(norm(u) for u in user_turns[:2])
        openings[opening] = openings.get(opening, False) or trained(dialogue)
        return False

    for miner in MINED_SETS.values():
        list(miner(DATA, keep, random.Random(0)))
    assert sum(openings.values()) > 500  # the split is real: most dialogues are training dialogues
    for name in ("gecor_followups", "gecor_openings", "kvret_rewrites", "crosswoz_dialogues"):
        convs = CONVERTERS[name](DATA, random.Random(1), 90)
        assert len(convs) >= 30, name
        seen = [tuple(norm(t.user) for t in c.turns[:2]) for c in convs if len(c.turns) >= 2]
        assert not [o for o in seen if openings.get(o)], name


@pytest.mark.slow  # reads the evaluation data in full
def test_converters_skip_rows_the_dev_traces_use() -> None:
    if not DEV.is_file():
        pytest.skip("no dev traces to keep apart from")
    dev_convs = [[norm(t["user"]) for t in json.loads(ln)["turns"]] for ln in DEV.read_text("utf-8").splitlines()]
    dev = {u for users in dev_convs for u in users}
    for name in ("pawsx_pairs", "qqp_pairs"):
        convs = CONVERTERS[name](DATA, random.Random(1), 300)
        assert len(convs) == 300
        assert not {norm(t.user) for c in convs for t in c.turns} & dev
    openings = {tuple(users[:2]) for users in dev_convs}
    camrest = CONVERTERS["gecor_followups"](DATA, random.Random(1), 300)
    assert len(camrest) >= 30  # the dialogues the verifier trained on are left out too
    assert not {tuple(norm(t.user) for t in c.turns[:2]) for c in camrest} & openings
    kvret = CONVERTERS["kvret_rewrites"](DATA, random.Random(1), 300)
    assert len(kvret) >= 30
    opened = CONVERTERS["gecor_openings"](DATA, random.Random(1), 300)
    assert len(opened) >= 100
    assert not {norm(c.turns[0].user) for c in opened} & {users[0] for users in dev_convs}
    assert not {norm(c.turns[-1].user) for c in kvret} & dev  # the paraphrases and gold rewrites


@pytest.mark.slow  # reads the evaluation data in full
def test_gecor_same_followup_other_context_gets_other_key(small: dict[str, list[Conversation]]) -> None:
    dials = json.loads((DATA / "gecor_camrest676" / "CamRest676_annotated.json").read_text("utf-8"))
    complete: dict[str, set[str]] = {}
    for d in dials:
        for t in d["dial"]:
            complete.setdefault(norm(t["usr"]["transcript"]), set()).add(t["usr"]["transcript_complete"])
    targets: dict[str, list[str]] = {}
    restated = 0
    for c in small["gecor_followups"]:
        last, prev = c.turns[-1], c.turns[-2]
        if last.key == prev.key:  # the complete form restated in the same conversation
            assert last.user in complete[norm(prev.user)] and norm(last.user) != norm(prev.user)
            restated += 1
            last = prev
        assert len({t.key for t in c.turns}) == len(c.turns) - (c.turns[-1].key == c.turns[-2].key)
        targets.setdefault(norm(last.user), []).append(last.key)
    assert restated >= 1
    assert any(len(keys) >= 2 for keys in targets.values())
    assert all(len(set(keys)) == len(keys) for keys in targets.values())


@pytest.mark.slow  # reads the evaluation data in full
def test_kvret_paraphrases_share_the_request_key(small: dict[str, list[Conversation]]) -> None:
    convs = {c.id: c for c in small["kvret_rewrites"]}
    mains = [c for cid, c in convs.items() if cid.count("-") == 1]
    assert mains
    for c in mains:
        assert len(c.turns) >= 3 and c.turns[-1].key == c.turns[-2].key
        assert len({t.key for t in c.turns[:-1]}) == len(c.turns) - 1
        fresh = [convs[f"{c.id}-p"].turns, convs[f"{c.id}-g"].turns]
        assert all(len(t) == 1 and t[0].key == c.turns[-1].key for t in fresh)
        assert len({norm(c.turns[-1].user), *(norm(t[0].user) for t in fresh)}) == 3


@pytest.mark.slow  # reads the evaluation data in full
def test_crosswoz_turns_are_own_keys_except_the_repeat(small: dict[str, list[Conversation]]) -> None:
    rows = {
        json.loads(ln)["dialog_id"]: json.loads(ln)
        for ln in (DATA / "crosswoz" / "val_turns.jsonl").read_text("utf-8").splitlines()
    }
    for c in small["crosswoz_dialogues"]:
        users = [t["content"] for t in rows[c.id.removeprefix("crosswoz-")]["turns"] if t["role"] == "usr"]
        keys = [t.key for t in c.turns]
        repeats = [i for i in range(1, len(keys)) if keys[i] == keys[i - 1]]
        assert len(set(keys)) == len(users)
        assert (c.category == "crosswoz_repeat") == bool(repeats) and len(repeats) <= 1
        assert [t.user for i, t in enumerate(c.turns) if i not in repeats] == users
        assert all(c.turns[i].user == c.turns[i - 1].user for i in repeats)
    assert Counter(c.category for c in small["crosswoz_dialogues"]).keys() == SOURCES["crosswoz_dialogues"]


@pytest.mark.slow  # reads the evaluation data in full
def test_mtbench_followups_never_share_keys_across_conversations(small: dict[str, list[Conversation]]) -> None:
    convs = small["mtbench_followups"]
    assert {c.category for c in convs} == SOURCES["mtbench_followups"]
    followups: dict[str, list[str]] = {}
    for c in convs:
        assert len({t.key for t in c.turns}) == len(c.turns) >= 2
        for t in c.turns[1:]:
            followups.setdefault(norm(t.user), []).append(t.key)
    shared = [keys for keys in followups.values() if len(keys) >= 2]
    assert shared, "the sample should hold one follow-up text in two conversations"
    assert all(len(set(keys)) == len(keys) for keys in shared)


@pytest.mark.slow  # reads the evaluation data in full
def test_realtime_probes_forbid_hits_and_regenerate(small: dict[str, list[Conversation]]) -> None:
    convs = small["realtime_probes"]
    regen = [c for c in convs if c.category == "regenerate_handwritten"]
    realtime = [c for c in convs if c.category == "realtime_handwritten"]
    assert regen and realtime
    assert all(t.expect == "no_hit" for c in realtime for t in c.turns)
    assert any(len(c.turns) == 2 and c.turns[0].key == c.turns[1].key for c in realtime)
    for c in regen:
        if c.turns[-1].regenerate:
            assert c.turns[-1].expect == "no_hit" and c.turns[-1].key == c.turns[-2].key
            first = next(o for o in regen if o.id == c.id.removesuffix("-again"))
            assert first.turns[0].key == c.turns[0].key and first.turns[0].answer
            assert convs.index(first) < convs.index(c)


def test_build_traces_is_per_name_deterministic() -> None:
    names = ["realtime_probes", "kvret_rewrites"]
    both = build_traces(DATA, names=names, seed=3, limit=12)
    alone = build_traces(DATA, names=["kvret_rewrites"], seed=3, limit=12)
    assert [c for c in both if c.category == "kvret_rewrite"] == alone
    assert check_traces(both) == []
    with pytest.raises(ValueError, match="nope"):
        build_traces(DATA, names=["nope"])


@pytest.mark.slow  # reads the evaluation data in full
def test_write_then_load_round_trip(tmp_path: Path, small: dict[str, list[Conversation]]) -> None:
    convs = small["realtime_probes"] + small["kvret_rewrites"]
    path = tmp_path / "t.jsonl"
    assert write_traces(path, convs) == len(convs)
    assert load_traces([path]) == convs
    other = tmp_path / "u.jsonl"
    write_traces(other, small["pawsx_pairs"])
    assert load_traces([path, other]) == convs + small["pawsx_pairs"]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("{not json", "Expecting"),
        (
            '{"id": "x", "category": "c", "tenant": "t", "session": "s", "system": "", "turns": [{"user": "hi"}]}',
            "turns[0]: 'key'",
        ),
        ('{"id": "x", "category": "c", "tenant": "t", "session": "s", "turns": []}', "'turns'"),
        (
            '{"id": "x", "category": "c", "tenant": "t", "session": "s", "turns": [{"user": "a", "key": "K1", '
            '"expect": "hit"}]}',
            "'expect'",
        ),
        (
            '{"id": "x", "category": "c", "tenant": "t", "session": "s", "turns": [{"user": "a", "key": "K1"}]}',
            "duplicate conversation id 'x'",
        ),
    ],
)
def test_bad_line_error_names_file_and_line(tmp_path: Path, line: str, says: str) -> None:
    good = Conversation("x", "c", "t", "s", "", (Turn("a", "K1"),))
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(good.to_json()) + "\n\n" + line + "\n", encoding="utf-8")
    with pytest.raises(TraceError) as err:
        load_traces([path])
    assert str(err.value).startswith(f"{path}:3: ")
    assert says in str(err.value)


def test_check_traces_finds_each_rule_break() -> None:
    k = prefix_key("s", ["q"])
    turns = (Turn("q", k, answer="A"), Turn("q", k, expect="no_hit", regenerate=True))
    ok = Conversation("a", "c", "t", "a", "s", turns)
    assert check_traces([ok]) == []
    clash = Conversation("b", "c", "t", "b", "s", (Turn(" Q ", "K2"),))  # same context after normalising
    shared = Conversation("c", "c", "t", "c", "s", (Turn("r", "K3", answer="A"),))
    bad_regen = Conversation("d", "c", "t", "d", "s", (Turn("r", "K3"), Turn("r", "K3", regenerate=True)))
    problems = check_traces([ok, clash, shared, bad_regen, ok])
    assert [p.split(":")[0] for p in problems] == ["b[0]", "c[0]", "d[1]", "a"]


def test_main_writes_the_traces_and_prints_counts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cal.jsonl"
    assert (
        main(
            [
                str(out),
                "--names",
                "realtime_probes",
                "kvret_rewrites",
                "--limit",
                "6",
                "--seed",
                "5",
                "--data-dir",
                str(DATA),
            ]
        )
        == 0
    )
    convs = load_traces([out])
    assert convs == build_traces(DATA, names=["realtime_probes", "kvret_rewrites"], seed=5, limit=6)
    printed = capsys.readouterr().out
    assert f"total {len(convs)} conversations" in printed and "kvret_rewrite " in printed
