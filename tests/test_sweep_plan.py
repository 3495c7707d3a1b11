"""Sweeps decided before anything starts, and the statistics they report: seeds and grids
parsed and checked (an unknown field, a value of the wrong type or out of range, too many
trials for the chips' memory), trials grouped by compiled program, and the interquartile
mean and bootstrap intervals checked on hand-made numbers."""

from __future__ import annotations

import numpy as np
import pytest

import workbench as wb
from workbench.engine import TrainConfig
from workbench.engine.statistics import (
    bootstrap_interval,
    curve_band,
    interquartile_mean,
    summarize,
)
from workbench.engine.sweep import check_memory
from workbench.engine.sweep_plan import (
    grid_points,
    group_trials,
    parse_grid_text,
    parse_seeds,
    trials_of,
)

ANAKIN = TrainConfig(env="workbench/CartPole-v1", mode="anakin")


def test_the_interquartile_mean_averages_the_middle_half():
    assert interquartile_mean([1, 2, 3, 4, 5, 6, 7, 100]) == pytest.approx(4.5)  # 3..6
    assert interquartile_mean([0, 0, 0, 1000]) == pytest.approx(0.0)
    assert interquartile_mean([2.0, 4.0]) == pytest.approx(3.0)  # fewer than 4: the mean


def test_a_bootstrap_interval_holds_the_estimate_and_is_reproducible():
    values = np.random.default_rng(0).normal(10.0, 2.0, size=40)
    low, high = bootstrap_interval(values, np.mean)
    assert low < values.mean() < high and high - low < 2.5
    assert (low, high) == bootstrap_interval(values, np.mean)
    # A wider spread gives a wider interval; one value gives the value itself.
    wide = bootstrap_interval(values * 3, np.mean)
    assert wide[1] - wide[0] > 2 * (high - low)
    assert bootstrap_interval([7.0], np.mean) == (7.0, 7.0)


def test_a_summary_counts_trials_that_never_reached_the_target():
    summary = summarize([1.0, None, 3.0, 2.0])
    assert (summary["count"], summary["missing"]) == (3, 1)
    assert summary["mean"] == pytest.approx(2.0) and summary["iqm"] == pytest.approx(2.0)
    assert summary["iqm_ci"][0] <= 2.0 <= summary["iqm_ci"][1]
    assert summarize([None, None])["iqm"] is None


def test_a_curve_band_skips_updates_without_episodes():
    band = curve_band([[1.0, np.nan, 3.0], [3.0, np.nan, 5.0]])
    assert band["iqm"][0] == 2.0 and np.isnan(band["iqm"][1]) and band["high"][2] == 4.5


@pytest.mark.parametrize(
    ("seeds", "expected"),
    [("0-3", (0, 1, 2, 3)), ("0,5,7", (0, 5, 7)), ("0-1,10", (0, 1, 10)), (3, (0, 1, 2)),
     ([4, 2], (4, 2))],
)
def test_seeds_are_ranges_lists_or_a_count(seeds, expected):
    assert parse_seeds(seeds) == expected


@pytest.mark.parametrize(
    ("seeds", "message"),
    [("0-x", "must be like 0-63"), ("", "must be like 0-63"), ([], "at least one seed"),
     ([1, 1], "names a seed twice"), ([-1], "from 0 to 2147483647"), ([2**31], "from 0")],
)
def test_bad_seeds_are_refused(seeds, message):
    with pytest.raises(ValueError, match=message):
        parse_seeds(seeds)


def test_a_grid_names_algorithm_and_run_fields_and_parses_them_by_type():
    grid = parse_grid_text(["ppo.learning_rate=1e-3,5e-4", "gamma=0.9,0.99",
                            "envs_per_chip=8"], ANAKIN)
    assert grid == {"ppo.learning_rate": [1e-3, 5e-4], "gamma": [0.9, 0.99],
                    "envs_per_chip": [8]}
    points = grid_points(ANAKIN, grid)
    assert len(points) == 4
    assert points[1].config.algo_config.learning_rate == 1e-3
    assert points[1].config.algo_config.gamma == 0.99
    assert {p.config.envs_per_chip for p in points} == {8}
    assert points[3].label() == "ppo.learning_rate=0.0005, gamma=0.99, envs_per_chip=8"


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ({"ppo.learning_rte": [1e-3]}, "learning_rte is not a field of ppo's config. Did you "
                                       "mean learning_rate"),
        ({"envs_per_chp": [8]}, "envs_per_chp is not a field of TrainConfig or ppo's config. "
                                "Did you mean envs_per_chip"),
        ({"pqn.learning_rate": [1e-3]}, "names algorithm 'pqn', but this sweep trains 'ppo'"),
        ({"learning_rate": ["fast"]}, "learning_rate must be a number, got 'fast'"),
        ({"hidden_sizes": [[64, "wide"]]}, "hidden_sizes must be comma-separated whole"),
        ({"learning_rate": [-1.0]}, "point learning_rate=-1.0: learning_rate must be a "
                                    "finite number > 0"),
        ({"gamma": []}, "gamma needs a list of values"),
        ({"seed": [1, 2]}, "seed cannot be swept: seeds are given apart"),
    ],
)
def test_a_grid_that_cannot_work_is_refused_naming_the_field(grid, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        grid_points(ANAKIN, grid)


def test_a_grid_entry_from_the_command_line_must_be_field_equals_values():
    with pytest.raises(ValueError, match="entries are field=value,value"):
        parse_grid_text(["learning_rate"], ANAKIN)


def test_too_many_trials_are_refused():
    points = grid_points(ANAKIN, {"learning_rate": [1e-3, 2e-3, 3e-3, 4e-3, 5e-3]})
    with pytest.raises(ValueError, match="make 5000 trials; a sweep runs at most 4096"):
        trials_of(points, range(1000))


def test_trials_that_differ_in_floats_share_one_program_and_widths_do_not():
    grid = {"learning_rate": [1e-3, 5e-4], "hidden_sizes": [(32,), (64,)]}
    trials = trials_of(grid_points(ANAKIN, grid), [0, 1, 2])
    groups = group_trials(trials, list(grid))
    assert len(trials) == 12 and len(groups) == 2
    assert all(g.traced_fields == ("learning_rate",) and len(g.trials) == 6 for g in groups)
    assert {g.trials[0].point.config.algo_config.hidden_sizes for g in groups} == {(32,), (64,)}


def test_more_trials_than_a_chips_memory_holds_are_refused_naming_the_limit():
    shape = wb.parse_shape("v6e", "2x2")  # 32 GiB of HBM per chip
    check_memory(shape, 64, 100 * 2**20)  # 16 trials of 100 MiB on each chip: fine
    with pytest.raises(ValueError, match=r"put 16 trials on each of the 4 chips of a v6e 2x2, "
                                         r"about 40\.0 GiB each, over the 32 GiB of a v6e "
                                         r"chip: sweep at most 48 trials"):
        check_memory(shape, 64, int(2.5 * 2**30))
