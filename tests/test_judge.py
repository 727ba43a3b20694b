"""The figures a teacher (or the student) is judged by before it teaches (``gte_pro.scoring.judge``), checked on
hand-made scores."""

import math

import numpy as np
import pytest

from gte_pro.scoring.judge import (
    entropy_at,
    entropy_curve,
    groups_from_rows,
    groups_from_window,
    judge,
    recommended_temperature,
)


def _entropy(scores, temperature):
    weights = [math.exp(s / temperature) for s in scores]
    total = sum(weights)
    return -sum(w / total * math.log(w / total) for w in weights)


def test_judge_figures_by_hand():
    groups = np.array([[2.0, 1.0, 0.0], [0.0, 1.0, math.nan]])
    figures = judge(groups, temperature=1.0)
    first, second = _entropy([2, 1, 0], 1.0), _entropy([0, 1], 1.0)
    assert figures["groups"] == 2
    assert figures["top1"] == 0.5  # the first positive beats both negatives, the second loses to its one
    assert figures["mean_margin"] == 0.0  # (2 - 1) + (0 - 1), over 2
    assert figures["mean_entropy"] == round((first + second) / 2, 4)
    assert figures["mean_normalised_entropy"] == round((first / math.log(3) + second / math.log(2)) / 2, 4)


def test_a_lower_temperature_sharpens_and_a_tie_is_not_a_win():
    groups = np.array([[1.0, 1.0, 0.0]])
    assert judge(groups, 1.0)["top1"] == 0.0
    assert judge(groups, 0.05)["mean_normalised_entropy"] < judge(groups, 1.0)["mean_normalised_entropy"]
    # cosines 0.8 vs 0.7 read at 1 are near uniform; at the sentence-transformers temperature 0.05 they are not
    cosines = np.array([[0.8, 0.7, 0.7]])
    assert judge(cosines, 1.0)["mean_normalised_entropy"] > 0.99
    assert judge(cosines, 0.05)["mean_normalised_entropy"] < 0.8


def test_the_recommended_temperature_gives_half_the_uniform_entropy():
    # two candidates a logit apart: normalised entropy 0.5 where p(negative) = 0.110028 (binary entropy of half a
    # bit), i.e. 1 / T = log(0.889972 / 0.110028) = 2.0905, T = 0.478
    temperature = recommended_temperature(np.array([[1.0, 0.0]]))
    assert temperature == pytest.approx(0.478, abs=0.001)
    assert judge(np.array([[1.0, 0.0]]), temperature)["mean_normalised_entropy"] == pytest.approx(0.5, abs=0.002)


def test_no_temperature_helps_tied_candidates_or_no_group():
    assert recommended_temperature(np.array([[1.0, 1.0, 1.0]])) is None
    assert recommended_temperature(np.zeros((0, 2))) is None
    assert judge(np.array([[1.0, 1.0, 1.0]]), 0.01)["mean_normalised_entropy"] == 1.0
    assert judge(np.zeros((0, 2)), 1.0)["top1"] is None


def test_groups_from_rows_one_per_positive_and_none_without_negatives():
    groups = groups_from_rows([([0.9, 0.8], [0.5, 0.1]), ([0.7], []), ([0.3], [0.4])])
    np.testing.assert_array_equal(groups, [[0.9, 0.5, 0.1], [0.8, 0.5, 0.1], [0.3, 0.4, math.nan]])


def test_groups_from_window_leaves_out_queries_without_positive_or_candidate():
    groups = groups_from_window(np.array([0.9, math.nan, 0.5]),
                                np.array([[0.2, math.nan], [0.1, 0.2], [math.nan, math.nan]]))
    np.testing.assert_array_equal(groups, np.array([[0.9, 0.2, math.nan]], dtype=np.float32))


def test_the_entropy_curve_is_read_between_its_points():
    assert entropy_at({"0.1": 0.2, "10": 0.8}, 1.0) == 0.5  # halfway in log(temperature)
    assert entropy_at({"0.1": 0.2, "10": 0.8}, 100.0) == 0.8
    assert entropy_at({}, 1.0) is None
    groups = np.array([[1.0, 0.0, -1.0], [0.5, 0.4, 0.0]])
    curve = entropy_curve(groups)
    assert entropy_at(curve, 1.0) == judge(groups, 1.0)["mean_normalised_entropy"]  # 1.0 is a point of the curve
    values = list(curve.values())
    assert values == sorted(values)  # entropy grows with the temperature
