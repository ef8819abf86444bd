"""The partitioned index: a tenant's records are searched apart from every other tenant's, exactly
while few and by a graph of their own once many, and a filtered search returns what the cache's own
visibility rule would admit, nothing else."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from proxy.core.identity import Identity
from proxy.service.reach import visible
from proxy.storage.base import IndexKey
from proxy.storage.hnsw import HnswIndex
from proxy.storage.mirror import GLOBAL_POOL, Codes, Want
from proxy.storage.partition import GraphSettings, Partition, from_bf16, to_bf16

MODEL, VERSION = "m", "v1"


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    v = rng.normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def key(
    tenant: str = "A",
    *,
    session: str = "s",
    user: str | None = None,
    scope: str = "tenant",
    version: str = VERSION,
    namespace: str = "",
    model: str = MODEL,
) -> IndexKey:
    return IndexKey.interned(10, tenant, session, user, scope, model, version, namespace, "general")


def want(tenant: str = "A", *, user: str | None = None, widen_to: str = "tenant", version: str = VERSION) -> Want:
    return Want(tenant, user, MODEL, "", version, widen_to)


def test_bfloat16_rows_score_like_float32() -> None:
    v = unit(np.random.default_rng(0), 500, 384)
    rows = from_bf16(to_bf16(v))
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    assert np.abs(rows @ v[3] - v @ v[3]).max() < 1e-3
    assert float(rows[3] @ v[3]) == pytest.approx(1.0, abs=1e-5)


def test_exact_search_finds_neighbours_and_deletes_drop_rows_at_once() -> None:
    rng = np.random.default_rng(0)
    index = HnswIndex(16)
    vectors = unit(rng, 200, 16)
    index.add(list(range(1, 201)), vectors, [key()] * 200)
    assert len(index) == 200 and index.partitions() == {"A": (200, False)}
    (label, score), *_ = index.search(vectors[41], 3, want=want())
    assert label == 42 and score > 0.9999
    index.delete([42, 43])
    assert 42 not in {lab for lab, _ in index.search(vectors[41], 10, want=want())}
    assert len(index) == 198 and index.deleted_fraction == 0  # nothing left behind to compact


def test_a_tenant_never_sees_another_tenants_label_even_the_nearest() -> None:
    rng = np.random.default_rng(1)
    index = HnswIndex(16, exact_limit=40)
    vectors = unit(rng, 300, 16)
    tenants = ["A", "B", "C"]
    index.add(list(range(300)), vectors, [key(tenants[i % 3]) for i in range(300)])
    assert index.partitions()["A"][1]  # past the limit: a graph
    for label in range(1, 300, 3):  # B's records, each the exact nearest to its own query
        found = index.search(vectors[label], 8, want=want("A"))
        assert len(found) == 8 and all(lab % 3 == 0 for lab, _ in found)
        assert index.search(vectors[label], 1, want=want("B"))[0][0] == label
    assert index.search(vectors[0], 8, want=want("nobody")) == []


def test_a_partition_grows_from_exact_to_a_graph_that_finds_the_same_neighbours() -> None:
    rng = np.random.default_rng(2)
    vectors = unit(rng, 150, 16)
    queries = unit(rng, 20, 16)
    exact, growing = HnswIndex(16), HnswIndex(16, exact_limit=100)
    for index in (exact, growing):
        for start in range(0, 150, 30):  # written over time, as a tenant's answers are
            index.add(list(range(start, start + 30)), vectors[start : start + 30], [key()] * 30)
    assert exact.partitions() == {"A": (150, False)} and growing.partitions() == {"A": (150, True)}
    # a graph is approximate, and how it links rows depends on the machine's distance kernels: what
    # holds everywhere is that it finds nearly all the exact neighbours, with the exact scores
    found = 0
    for q in queries:
        expected = dict(exact.search(q, 5, want=want()))
        walked = growing.search(q, 5, want=want())
        assert len(walked) == 5
        for label, score in walked:
            assert float(vectors[label] @ q) == pytest.approx(score, abs=1e-2)
        found += len(expected.keys() & {lab for lab, _ in walked})
    assert found >= 0.95 * 5 * len(queries)
    growing.delete(range(0, 150, 2))
    assert growing.deleted_fraction == pytest.approx(75 / 150)
    assert all(lab % 2 for lab, _ in growing.search(vectors[0], 10, want=want()))


def test_what_lands_while_a_graph_is_built_is_in_it_when_it_takes_over() -> None:
    rng = np.random.default_rng(9)
    vectors = unit(rng, 140, 16)
    settings = GraphSettings(16, 16, 100, 96, exact_limit=100)
    pool, codes = Partition.empty(16), Codes()
    pool.add(np.arange(120), vectors[:120], codes.columns([key()] * 120), settings)
    due = pool.due(settings.exact_limit)
    assert due is not None and pool.due(settings.exact_limit) is None  # one build at a time
    built, rows = due
    pool.add(np.arange(120, 140), vectors[120:], codes.columns([key()] * 20), settings)  # meanwhile
    pool.remove(np.arange(0, 10))
    assert pool.search(vectors[130], 1, None)[0][0] == 130  # still exact, and current
    pool.take_graph(settings.build(rows, built), built, settings)
    assert pool.graph is not None and pool.tombstones == 10
    for label in (10, 119, 120, 139):
        assert pool.search(vectors[label], 1, None)[0][0] == label
    assert all(lab >= 10 for lab, _ in pool.search(vectors[3], 20, None))


def test_a_graph_with_few_admitted_records_ranks_them_all() -> None:
    rng = np.random.default_rng(3)
    index = HnswIndex(16, exact_limit=50)
    vectors = unit(rng, 400, 16)
    keys = [key(version="v2" if i in (7, 150, 333) else VERSION) for i in range(400)]
    index.add(list(range(400)), vectors, keys)
    found = index.search(vectors[5], 8, want=want(version="v2"))
    assert sorted(lab for lab, _ in found) == [7, 150, 333]
    assert [s for _, s in found] == sorted((s for _, s in found), reverse=True)


def test_a_graph_masks_its_nearest_when_many_are_admitted() -> None:
    rng = np.random.default_rng(10)
    n = 4500
    index = HnswIndex(16, exact_limit=500)
    vectors = unit(rng, n, 16)
    index.add(list(range(n)), vectors, [key(version="v2" if i % 3 else VERSION) for i in range(n)])
    admitted = np.arange(0, n, 3)
    assert len(admitted) > 500  # more than are ranked exactly: the graph is walked
    for q in unit(rng, 10, 16):
        found = [lab for lab, _ in index.search(q, 8, want=want())]
        assert len(found) == 8 and all(lab % 3 == 0 for lab in found)
        exact = set(admitted[np.argsort(-(vectors[admitted] @ q))[:8]].tolist())
        assert len(exact & set(found)) >= 7  # a graph walk: approximate


def test_labels_adopted_out_of_order_stay_addressable() -> None:
    rng = np.random.default_rng(4)
    index = HnswIndex(8)
    vectors = unit(rng, 30, 8)
    index.add(list(range(10, 30)), vectors[10:], [key()] * 20)
    index.add(list(range(10)), vectors[:10], [key()] * 10)  # another replica's older records, late
    index.add([12], vectors[3:4], [key()])  # already here: left alone
    ranked = index.search_among(vectors[5], [1, 5, 29, 99])
    assert ranked[0][0] == 5 and {lab for lab, _ in ranked} == {1, 5, 29}
    assert index.search_among(vectors[12], [12])[0][1] == pytest.approx(1.0, abs=1e-5)
    index.delete([5, 12])
    assert {lab for lab, _ in index.search(vectors[12], 30, want=want())} == set(range(30)) - {5, 12}


def test_global_records_are_shared_and_searched_beside_the_tenant() -> None:
    rng = np.random.default_rng(5)
    index = HnswIndex(8)
    vectors = unit(rng, 4, 8)
    index.add([1, 2, 3, 4], vectors, [key("A"), key("B"), key("B", scope="global"), key("C", scope="user")])
    assert set(index.partitions()) == {"A", "B", GLOBAL_POOL, "C"}
    assert {lab for lab, _ in index.search(vectors[0], 8, want=want("A", widen_to="global"))} == {1, 3}
    assert {lab for lab, _ in index.search(vectors[0], 8, want=want("A", widen_to="tenant"))} == {1}
    assert {lab for lab, _ in index.search(vectors[0], 8, want=want("B", widen_to="tenant"))} == {2, 3}


CALLER = Identity(tenant="A", session="s1", user="u1", session_explicit=True)
SCOPES = ("session", "user", "tenant", "global")


@pytest.mark.parametrize("widen_to", SCOPES)
@pytest.mark.parametrize("caller_user", ["u1", None])
def test_the_mask_is_the_caches_visibility_rule(widen_to: str, caller_user: str | None) -> None:
    """Every combination of tenant, user, scope and match of model, namespace and version, outside the
    caller's own session (which the cache searches exactly beside the index)."""
    who = Identity(CALLER.tenant, CALLER.session, caller_user, True)
    keys = [
        key(tenant, session="other", user=user, scope=scope, model=model, namespace=ns, version=version)
        for tenant, user, scope, model, ns, version in itertools.product(
            ("A", "B"), ("u1", "u2", None), SCOPES, (MODEL, "m2"), ("", "ns"), (VERSION, "v2")
        )
    ]
    codes = Codes()
    cols = codes.columns(keys)
    mask = codes.coded(Want(who.tenant, who.user, MODEL, "", VERSION, widen_to)).mask(cols)
    expected = [
        k.model == MODEL and k.namespace == "" and k.system_prompt_version == VERSION and visible(k, who, widen_to)
        for k in keys
    ]
    assert mask.tolist() == expected
    assert any(expected) == (widen_to in ("tenant", "global") or (widen_to == "user" and caller_user is not None))


def test_the_repeat_mask_admits_the_whole_tenant_whatever_the_pool() -> None:
    """The search for an exact repeat (``any_scope``): every record of the caller's tenant (or of its
    user, widening to "user") with the request's model, namespace and version, session- and
    user-scoped ones included; no other tenant's, not even one written to the global pool."""
    keys = [
        key(tenant, session="other", user=user, scope=scope, model=model, version=version)
        for tenant, user, scope, model, version in itertools.product(
            ("A", "B"), ("u1", "u2", None), SCOPES, (MODEL, "m2"), (VERSION, "v2")
        )
    ]
    codes = Codes()
    cols = codes.columns(keys)
    mine = [k.tenant == "A" and k.model == MODEL and k.system_prompt_version == VERSION for k in keys]
    tenant = codes.coded(Want("A", None, MODEL, "", VERSION, "tenant", any_scope=True)).mask(cols)
    assert tenant.tolist() == mine
    user = codes.coded(Want("A", "u1", MODEL, "", VERSION, "user", any_scope=True)).mask(cols)
    assert user.tolist() == [m and k.user == "u1" for m, k in zip(mine, keys, strict=True)]
    nobody = codes.coded(Want("A", None, MODEL, "", VERSION, "user", any_scope=True)).mask(cols)
    assert not nobody.any()  # a caller without a user shares no user's repeats


@pytest.mark.parametrize("exact_limit", [150, 10_000])
def test_filtered_search_plus_the_session_is_the_exact_top_k_of_what_the_cache_admits(exact_limit: int) -> None:
    """What ``SemanticCache.nearest`` does (the session exactly, then the widened search) against
    brute force over every record the cache's own rule admits: the same top k, in a graph and not."""
    rng = np.random.default_rng(6)
    n, k = 600, 8
    vectors = unit(rng, n, 32)
    keys = [
        key(
            str(rng.choice(["A", "B"])),
            session=str(rng.choice(["s1", "s2", "s3"])),
            user=str(rng.choice(["u1", "u2"])),
            scope=str(rng.choice(SCOPES)),
            version=str(rng.choice([VERSION, "v2"])),
        )
        for _ in range(n)
    ]
    index = HnswIndex(32, exact_limit=exact_limit)
    index.add(list(range(n)), vectors, keys)
    assert index.partitions()["A"][1] == (exact_limit == 150)
    for widen_to in ("user", "tenant", "global"):
        for q in unit(rng, 10, 32):
            admitted = [
                i for i in range(n) if keys[i].system_prompt_version == VERSION and visible(keys[i], CALLER, widen_to)
            ]
            expected = set(sorted(admitted, key=lambda i: -float(vectors[i] @ q))[:k])
            session = [i for i in admitted if keys[i].tenant == "A" and keys[i].session == "s1"]
            found = index.search_among(q, session) + index.search(
                q, k, want=Want("A", "u1", MODEL, "", VERSION, widen_to)
            )
            best: dict[int, float] = {}
            for label, score in found:
                best[label] = max(score, best.get(label, -1.0))
            assert set(sorted(best, key=lambda lab: -best[lab])[:k]) == expected  # near ties may swap places


def test_snapshot_round_trip_of_exact_and_graph_partitions(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    index = HnswIndex(16, exact_limit=100)
    vectors = unit(rng, 400, 16)
    keys = [
        key("big") if i < 300 else key(f"small-{i % 4}", scope="global" if i % 5 == 0 else "tenant") for i in range(400)
    ]
    index.add(list(range(400)), vectors, keys)
    index.delete([5, 6, 350])
    path = tmp_path / "index.hnsw"
    index.save(path, stamp="s")
    index.save(path, stamp="s")  # again: the first save's graph files go
    assert len(list(tmp_path.glob("index.hnsw.*.graph"))) == 1
    loaded = HnswIndex.from_snapshot(path, dim=16, stamp="s")
    assert loaded is not None
    assert loaded.labels() == index.labels() and loaded.partitions() == index.partitions()
    assert loaded.deleted_fraction == pytest.approx(index.deleted_fraction)
    for q in unit(rng, 10, 16):
        for w in (want("big"), want("small-1", widen_to="global"), None):
            assert loaded.search(q, 5, want=w) == index.search(q, 5, want=w)
    loaded.add([400], unit(rng, 1, 16), [key("big")])  # still growable after loading
    assert 400 in loaded.labels()


def test_a_snapshot_of_another_format_or_a_damaged_one_is_refused(tmp_path: Path) -> None:
    index = HnswIndex(8)
    index.add([1, 2], unit(np.random.default_rng(8), 2, 8), [key(), key()])
    path = tmp_path / "index.hnsw"
    index.save(path, stamp="s")
    data = path.read_bytes()
    path.write_bytes(data[:-4])
    with pytest.raises(ValueError, match="bytes"):
        HnswIndex.from_snapshot(path, dim=8, stamp="s")
    path.write_bytes(b"x" * 32 + data[32:])  # another save's data under this table of contents
    with pytest.raises(ValueError, match="another save"):
        HnswIndex.from_snapshot(path, dim=8, stamp="s")
    Path(f"{path}.json").write_text('{"stamp": "s", "dim": 8, "live": []}')  # the single-graph format
    assert HnswIndex.from_snapshot(path, dim=8, stamp="s") is None


def test_snapshot_round_trip_keeps_graph_live_labels_and_deletions(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    index = HnswIndex(32, exact_limit=100)
    vectors = unit(rng, 300, 32)
    index.add(list(range(1, 301)), vectors, [key("t")] * 300)
    index.delete([5, 6, 7])
    path = tmp_path / "index.hnsw"
    index.save(path, stamp="m dim=32 store=a")
    loaded = HnswIndex.from_snapshot(path, dim=32, stamp="m dim=32 store=a")
    assert loaded is not None
    assert loaded.labels() == index.labels() and len(loaded) == 297
    assert loaded.deleted_fraction == pytest.approx(index.deleted_fraction)
    for q in unit(rng, 20, 32):
        assert loaded.search(q, 5) == index.search(q, 5)
    assert all(lab not in (5, 6, 7) for lab, _ in loaded.search(vectors[5], 10))
    loaded.add([301], unit(rng, 1, 32), [key("t")])  # still growable after loading
    assert 301 in loaded.labels()


@pytest.mark.parametrize(
    ("dim", "stamp"), [(32, "other-model dim=32 store=a"), (32, "m dim=32 store=b"), (16, "m dim=32 store=a")]
)
def test_a_snapshot_of_another_model_store_or_shape_is_not_used(tmp_path: Path, dim: int, stamp: str) -> None:
    index = HnswIndex(32)
    index.add([1, 2], unit(np.random.default_rng(1), 2, 32), [key("t"), key("t")])
    index.save(tmp_path / "index.hnsw", stamp="m dim=32 store=a")
    assert HnswIndex.from_snapshot(tmp_path / "index.hnsw", dim=dim, stamp=stamp) is None
    assert HnswIndex.from_snapshot(tmp_path / "missing.hnsw", dim=32, stamp="m dim=32 store=a") is None


def test_a_small_lookup_runs_on_the_callers_thread_and_a_busy_or_large_one_does_not() -> None:
    rng = np.random.default_rng(5)
    index = HnswIndex(16, exact_limit=100)
    small = unit(rng, 40, 16)
    index.add(list(range(1, 41)), small, [key("A", session=f"s{i % 4}") for i in range(40)])
    index.add([41, 42], unit(rng, 2, 16), [key("B", scope="global")] * 2)
    index.add(list(range(100, 300)), unit(rng, 200, 16), [key("C")] * 200)  # past exact_limit: a graph
    session = [1, 5, 9, 13]
    for q in unit(rng, 10, 16):
        now = index.search_both_now(q, session, 5, want("A"), max_rows=64)
        assert now == (index.search_among(q, session), index.search(q, 5, want=want("A")))
        assert index.search_both(q, session, 5, want("A")) == now  # the executor's path, the same answer
        # a lookup that does not widen reads its session only
        assert index.search_both_now(q, session, 5, None, max_rows=64) == (index.search_among(q, session), [])
    q = small[0]
    assert index.search_both_now(q, session, 5, want("A"), max_rows=41) is None  # 40 rows + 2 shared
    assert index.search_both_now(q, session, 5, want("A"), max_rows=42) is not None
    assert index.search_both_now(q, [], 5, want("C"), max_rows=10_000) is None  # C's partition is a graph
    index._lock.acquire()  # another thread adding, deleting or saving: the loop must not wait for it
    try:
        assert index.search_both_now(q, session, 5, want("A"), max_rows=64) is None
    finally:
        index._lock.release()


def test_a_small_add_goes_in_on_the_callers_thread_unless_busy_or_bound_for_a_graph() -> None:
    rng = np.random.default_rng(6)
    inline, threaded = HnswIndex(16, exact_limit=50), HnswIndex(16, exact_limit=50)
    keys = [key("A", session=f"s{i % 3}") for i in range(45)] + [key("B", scope="global")] * 5
    vectors = unit(rng, 50, 16)
    for label, v, k in zip(range(1, 51), vectors, keys, strict=True):
        assert inline.add_now([label], v.reshape(1, -1), [k])
        threaded.add([label], v.reshape(1, -1), [k])
    assert inline.partitions() == threaded.partitions() == {"A": (45, False), GLOBAL_POOL: (5, False)}
    for q in unit(rng, 10, 16):  # the same rows as the executor's add: the same answers
        assert inline.search(q, 5, want=want("A")) == threaded.search(q, 5, want=want("A"))
    assert inline.add_now([1], vectors[:1], keys[:1])  # a label already here is left alone, as by add
    assert len(inline) == 50

    more = unit(rng, 6, 16)
    assert not inline.add_now(list(range(60, 66)), more, [key("A")] * 6)  # 51 rows: due a graph
    assert not inline.add_now(list(range(70, 121)), unit(rng, 51, 16), [key("D")] * 51)  # a new one, too big
    inline._lock.acquire()  # another thread adding, deleting or saving: the loop must not wait for it
    try:
        assert not inline.add_now([60], more[:1], [key("A")])
    finally:
        inline._lock.release()
    assert len(inline) == 50 and 60 not in inline.labels()  # declining added nothing

    inline.add(list(range(60, 66)), more, [key("A")] * 6)  # off the loop: A becomes a graph
    assert inline.partitions()["A"] == (51, True)
    assert not inline.add_now([200], unit(rng, 1, 16), [key("A")])  # a graph's add costs a walk
    assert inline.add_now([201], unit(rng, 1, 16), [key("E")])  # another tenant's exact rows still go in
