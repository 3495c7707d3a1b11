"""Soak: many cycles of reserve, a short training run and release on one simulated cluster,
checking that nothing accumulates.

Prints one JSON object with, before and after the cycles: the cluster's processes (its
whole process tree: simulator, Ray daemons, workers), live placement groups, live actors,
and the memory (RSS and PSS) of that tree and of this driver. The peer, run in the same
invocation on the same cluster, is the same number of cycles of a plain
``ray.util.placement_group`` of the same bundles, reserved and removed with no training;
``cycle_time_ratio`` is the median soak cycle over the median peer cycle.

One cycle runs first as a warm-up and is not counted: it fills Ray's idle worker pool and
the learners' compilation cache to the level every later cycle leaves them at. After the
warm-up and after the cycles, the counts get ``--settle-s`` to come back (a killed actor's
process exits a moment later). Exits 1 when anything leaked: a placement group or actor
more than before, more processes than before plus ``--process-slack`` (Ray may keep an
idle worker or two warm), or tree PSS grown by more than ``--memory-slack-mib``.

    .venv/bin/python benchmarks/soak.py --cycles 50
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable

import psutil

import workbench as wb
from workbench.engine import TrainConfig, train

GENERATION, TOPOLOGY = "v6e", "2x2"
CPUS_PER_CHIP = 2

log = logging.getLogger("soak")


def tiny_config() -> TrainConfig:
    """A run that starts every actor of a real run and does a few updates."""
    return TrainConfig(total_env_steps=2048, envs_per_chip=4, rollout_length=16,
                       eval_every=0, eval_episodes=1)


def _live_placement_groups() -> int:
    import ray

    return sum(pg["state"] != "REMOVED" for pg in ray.util.placement_group_table().values())


def _live_actors() -> int:
    # The GCS actor table: the state API proper needs the dashboard, which the simulated
    # cluster leaves off.
    from ray._private.state import actors

    return sum(a["State"] != "DEAD" for a in actors().values())


def _live_processes(cluster: wb.LocalCluster) -> list[psutil.Process]:
    alive = []
    for pid in cluster.process_ids():
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.NoSuchProcess:
            continue
    return alive


def _mib(value: float) -> float:
    return round(value / 1024**2, 1)


def counts(cluster: wb.LocalCluster) -> dict[str, int]:
    """What must not accumulate: processes of the cluster, placement groups, actors."""
    return {
        "processes": len(_live_processes(cluster)),
        "placement_groups": _live_placement_groups(),
        "actors": _live_actors(),
    }


def snapshot(cluster: wb.LocalCluster) -> dict[str, float]:
    """:func:`counts` plus the memory of the cluster's process tree and of this driver."""
    rss = pss = 0
    for proc in _live_processes(cluster):
        try:
            memory = proc.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss += memory.rss
        pss += memory.pss
    driver = psutil.Process().memory_full_info()
    return {
        **counts(cluster),
        "tree_rss_mib": _mib(rss),
        "tree_pss_mib": _mib(pss),
        "driver_rss_mib": _mib(driver.rss),
        "driver_pss_mib": _mib(driver.pss),
    }


def _settle(cluster: wb.LocalCluster, before: dict, process_slack: int,
            timeout_s: float) -> float:
    """Wait until the counts are back at ``before`` and have stopped moving (processes of
    killed actors are still exiting); returns the seconds it took."""
    started = time.monotonic()
    previous = None
    while time.monotonic() - started < timeout_s:
        now = counts(cluster)
        back = (now["placement_groups"] <= before["placement_groups"]
                and now["actors"] <= before["actors"]
                and now["processes"] <= before["processes"] + process_slack)
        if back and now == previous:
            break
        previous = now
        time.sleep(1.0)
    return round(time.monotonic() - started, 1)


def _cycles(cluster: wb.LocalCluster, cycles: int, one_cycle: Callable[[], dict],
            process_slack: int, settle_s: float) -> dict:
    before = snapshot(cluster)
    per_cycle = []
    times = []
    for index in range(cycles):
        started = time.monotonic()
        extra = one_cycle()
        seconds = time.monotonic() - started
        times.append(seconds)
        now = counts(cluster)
        per_cycle.append({"s": round(seconds, 4), **extra, **now})
        log.info("cycle %d/%d: %.1f s, %s", index + 1, cycles, seconds, now)
    settle_took = _settle(cluster, before, process_slack, settle_s)
    after = snapshot(cluster)
    return {
        "before": before,
        "after": after,
        "growth": {k: round(after[k] - before[k], 1) for k in before},
        "cycle_s_median": round(statistics.median(times), 4),
        "cycle_s_max": round(max(times), 4),
        "settle_s": settle_took,
        "per_cycle": per_cycle,
    }


def _leaks(name: str, result: dict, process_slack: int, memory_slack_mib: float) -> list[str]:
    growth = result["growth"]
    found = [f"{name}: {int(growth[k])} more {k.replace('_', ' ')} than before"
             for k in ("placement_groups", "actors") if growth[k] > 0]
    if growth["processes"] > process_slack:
        found.append(f"{name}: {int(growth['processes'])} more processes than before "
                     f"(allowed: {process_slack})")
    if growth["tree_pss_mib"] > memory_slack_mib:
        found.append(f"{name}: the cluster's PSS grew by {growth['tree_pss_mib']} MiB "
                     f"(allowed: {memory_slack_mib})")
    return found


def soak(cluster: wb.LocalCluster, cycles: int, *, config: TrainConfig | None = None,
         process_slack: int = 2, memory_slack_mib: float = 300.0,
         settle_s: float = 60.0) -> dict:
    """Run the soak and its peer on a connected simulated cluster with a free v6e 2x2.

    Args:
        cluster: the simulated cluster this process is connected to.
        cycles: reserve/train/release cycles to count (after one warm-up cycle).
        config: the training run of each cycle; :func:`tiny_config` by default.
        process_slack: processes more than before that are not a leak (idle workers).
        memory_slack_mib: growth of the cluster's PSS that is not a leak.
        settle_s: how long the counts get to come back after the last cycle.

    Returns:
        The report: ``soak`` and ``peer`` (before, after, growth, cycle times), the
        cycle-time ratio, ``leaks`` (empty when nothing leaked) and ``ok``.

    Raises:
        ValueError: ``cycles`` is not a positive whole number.
    """
    import ray

    if isinstance(cycles, bool) or not isinstance(cycles, int) or cycles < 1:
        raise ValueError(f"cycles must be a positive whole number, got {cycles!r}.")
    config = config or tiny_config()
    shape = wb.parse_shape(GENERATION, TOPOLOGY)

    def train_cycle() -> dict:
        with wb.reserve(GENERATION, TOPOLOGY, timeout_s=120,
                        cpus_per_chip=CPUS_PER_CHIP) as tpu_slice:
            return {"env_steps": train(tpu_slice, config).env_steps}

    def peer_cycle() -> dict:
        bundles = [{"TPU": 1, "CPU": CPUS_PER_CHIP}] * shape.chips
        group = ray.util.placement_group(bundles, strategy="STRICT_PACK")
        try:
            ray.get(group.ready(), timeout=120)
        finally:
            ray.util.remove_placement_group(group)
        return {}

    started = time.monotonic()
    idle = counts(cluster)
    train_cycle()  # warm-up, not counted
    # Its actors' processes exit a moment after release; "before" is taken once they have.
    _settle(cluster, idle, process_slack, settle_s)
    warm_up_s = time.monotonic() - started
    soaked = _cycles(cluster, cycles, train_cycle, process_slack, settle_s)
    peer = _cycles(cluster, cycles, peer_cycle, process_slack, settle_s)
    leaks = (_leaks("soak", soaked, process_slack, memory_slack_mib)
             + _leaks("peer", peer, process_slack, memory_slack_mib))
    return {
        "benchmark": "soak",
        "cycles": cycles,
        "shape": shape.label,
        "train_config": {k: v for k, v in dataclasses.asdict(config).items() if k != "ppo"},
        "warm_up_s": round(warm_up_s, 1),
        "soak": soaked,
        "peer": peer,
        # A placement-group cycle can take well under a millisecond: no ratio against zero.
        "cycle_time_ratio": (round(soaked["cycle_s_median"] / peer["cycle_s_median"], 1)
                             if peer["cycle_s_median"] > 0 else None),
        "leaks": leaks,
        "ok": not leaks,
        "wall_s": round(time.monotonic() - started, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--process-slack", type=int, default=2)
    parser.add_argument("--memory-slack-mib", type=float, default=300.0)
    parser.add_argument("--settle-s", type=float, default=60.0)
    parser.add_argument("-v", "--verbose", action="store_true", help="log every cycle")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        stream=sys.stderr)
    if args.cycles < 1:
        parser.error(f"--cycles must be a positive whole number, got {args.cycles}")
    started = time.monotonic()
    with wb.local_cluster([(GENERATION, TOPOLOGY)]) as cluster:
        cluster_start_s = time.monotonic() - started
        report = soak(cluster, args.cycles, process_slack=args.process_slack,
                      memory_slack_mib=args.memory_slack_mib, settle_s=args.settle_s)
    report["cluster_start_s"] = round(cluster_start_s, 1)
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
