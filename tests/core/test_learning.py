"""Learned levels: the bound, the fit, the per-user cap and the audit sample (proxy.core.learning)."""

from __future__ import annotations

import math
import random

import pytest

from proxy.core.learning import (
    AGREEMENT_DOUBT,
    LEVELS,
    Label,
    Source,
    fit_level,
    labels_needed,
    lower_bound,
    sampled,
    upper_bound,
)


def _binomial_cdf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


@pytest.mark.parametrize(("errors", "n"), [(0, 10), (1, 100), (5, 1000), (3, 40)])
def test_the_upper_bound_is_the_rate_at_which_so_few_errors_are_a_5_percent_tail(errors: int, n: int) -> None:
    p = upper_bound(errors, n)
    assert _binomial_cdf(errors, n, p) == pytest.approx(0.05, abs=1e-9)
    assert p > errors / n


def test_bounds_at_the_edges() -> None:
    assert upper_bound(0, 0) == 1.0 and upper_bound(7, 7) == 1.0
    assert upper_bound(0, 10) == pytest.approx(1 - 0.05 ** (1 / 10))
    assert lower_bound(0, 10) == 0.0
    assert lower_bound(30, 100) < 0.30 < upper_bound(30, 100)
    assert upper_bound(0.5, 600) > upper_bound(0, 600)  # a fractional error counts, a little


def test_labels_needed_is_the_rule_of_three_made_exact() -> None:
    assert labels_needed(0.005) == 598
    assert upper_bound(0, labels_needed(0.005)) <= 0.005 < upper_bound(0, labels_needed(0.005) - 1)


def _labels(
    n: int, score: float, *, wrong: int = 0, user: str = "", source: Source = Source.JUDGE, at: float = 0.0
) -> list[Label]:
    return [Label("general", score, i >= wrong, source, user or f"u{i}", f"sc-{i}", at + i) for i in range(n)]


def test_no_level_until_enough_labels_say_right() -> None:
    assert fit_level(_labels(500, 0.99), max_error=0.005, per_user=50) is None
    level = fit_level(_labels(700, 0.99), max_error=0.005, per_user=50)
    assert level is not None and level.score == 0.99 and level.n == 700 and level.bound <= 0.005


def test_the_level_goes_down_to_where_the_wrong_ones_begin() -> None:
    clean = _labels(800, 0.97)
    mixed = _labels(300, 0.9, wrong=60)
    level = fit_level(clean + mixed, max_error=0.005, per_user=50)
    assert level is not None and level.score == 0.97 and level.errors == 0


def test_one_wrong_label_above_a_level_needs_more_right_ones() -> None:
    with_one = _labels(800, 0.99, wrong=1)
    assert upper_bound(1, 800) > 0.005
    assert fit_level(with_one, max_error=0.005, per_user=50) is None
    assert fit_level(_labels(1000, 0.99, wrong=1), max_error=0.005, per_user=50) is not None


def test_agreement_labels_count_as_a_fraction_of_an_error() -> None:
    by_agreement = _labels(700, 0.99, source=Source.AGREEMENT)
    assert fit_level(by_agreement, max_error=0.005, per_user=50) is None  # 700 x doubt is far too many
    level = fit_level(by_agreement, max_error=0.1, per_user=50)
    assert level is not None and level.errors == pytest.approx(700 * AGREEMENT_DOUBT)


def test_one_user_counts_at_most_per_user_labels() -> None:
    one_user = _labels(5000, 0.99, user="mallory")
    assert fit_level(one_user, max_error=0.005, per_user=50) is None
    others = _labels(540, 0.99)
    # 540 others and mallory's 50: still under the 598 a level needs, however many mallory sends
    assert fit_level(others + one_user, max_error=0.005, per_user=50) is None
    assert fit_level(others + one_user, max_error=0.005, per_user=100) is not None


def test_a_distrusted_source_no_longer_counts() -> None:
    labels = _labels(700, 0.99)
    assert fit_level(labels, max_error=0.005, per_user=50) is not None
    assert fit_level(labels, max_error=0.005, per_user=50, exclude=frozenset({Source.JUDGE})) is None


def test_the_search_stops_at_the_first_level_that_fails() -> None:
    # clean at the top, a bad band in the middle, clean again below: the level never skips the band
    top = _labels(700, LEVELS[2])
    band = [Label("general", LEVELS[4], False, Source.JUDGE, f"b{i}", "sc", 0.0) for i in range(20)]
    below = _labels(50_000, LEVELS[-1])
    level = fit_level(top + band + below, max_error=0.005, per_user=50)
    assert level is not None and level.score == LEVELS[2]


def test_the_audit_sample_is_the_rate_asked_for_and_the_same_every_time() -> None:
    keys = [f"req-{i}" for i in range(20_000)]
    share = sum(sampled(k, 0.05, "judge") for k in keys) / len(keys)
    assert 0.04 < share < 0.06
    assert [sampled(k, 0.05, "judge") for k in keys[:100]] == [sampled(k, 0.05, "judge") for k in keys[:100]]
    # each purpose draws its own share
    assert {k for k in keys if sampled(k, 0.05, "judge")} != {k for k in keys if sampled(k, 0.05, "level")}
    assert not any(sampled(k, 0.0, "judge") for k in keys)


def test_a_fit_never_serves_where_the_truth_is_above_the_target() -> None:
    # labels drawn at a true error of 2 %, far above the 0.5 % target: no level, in 200 draws
    rng = random.Random(7)
    for _ in range(200):
        labels = [
            Label("general", 0.99, rng.random() >= 0.02, Source.JUDGE, f"u{i}", "sc", float(i)) for i in range(1500)
        ]
        assert fit_level(labels, max_error=0.005, per_user=50) is None
