"""Repeated reserve, short training and release on the session cluster leave nothing
behind: the short version of benchmarks/soak.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

# Every test here trains on the session cluster: the slow tier.
pytestmark = pytest.mark.slow

SOAK = Path(__file__).resolve().parent.parent / "benchmarks" / "soak.py"


def _soak_module():
    spec = importlib.util.spec_from_file_location("soak", SOAK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_three_training_cycles_leave_no_process_placement_group_or_actor(cluster):
    soak = _soak_module()
    # Three cycles of reserve, train and release: a warm-up, then two counted ones. With
    # one process of slack, a process left behind by every cycle still shows (2 > 1).
    report = soak.soak(cluster, 2, process_slack=1)
    cycles = report["soak"]["per_cycle"]
    # Every cycle really trained: the full step budget (2048 steps, 8 updates of 4 chips x
    # 4 envs x 16 steps), on a slice it held.
    assert soak.tiny_config().total_env_steps == 2048
    assert [c["env_steps"] for c in cycles] == [2048, 2048], cycles
    growth = report["soak"]["growth"]
    assert growth["placement_groups"] == 0 and growth["actors"] == 0, report["soak"]
    assert growth["processes"] <= 1, report["soak"]
    assert report["peer"]["growth"]["placement_groups"] == 0
    assert not [leak for leak in report["leaks"] if "PSS" not in leak], report["leaks"]
