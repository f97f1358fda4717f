"""``kerasdist bench`` alternates the order of its rows between repeats (issue 30's lifecycle
cost: the ``keras_enable`` row used to run first in every repeat)."""

from __future__ import annotations

from kerasdist.bench.command import repeat_order


def test_even_repeats_run_baselines_first_and_odd_repeats_the_reverse():
    first = repeat_order(["keras_enable"], ["default", "default_stream"], 0)
    assert first == [("baseline", "keras_enable"), ("strategy", "default"),
                     ("strategy", "default_stream")]
    assert repeat_order(["keras_enable"], ["default", "default_stream"], 1) == first[::-1]
    assert repeat_order(["keras_enable"], ["default", "default_stream"], 2) == first


def test_every_row_runs_once_per_repeat():
    for rep in range(4):
        order = repeat_order(["plain_keras", "tf_keras"], ["default", "mirrored"], rep)
        assert sorted(name for _, name in order) == ["default", "mirrored", "plain_keras",
                                                     "tf_keras"]
