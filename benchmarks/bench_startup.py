"""Start-up of a run on a simulated v6e 2x2: learners kept warm against learners started
for every run, in one invocation.

Prints one JSON object. Both sides run on one simulated cluster, on slices of the same
shape, the same runs in the same order (PPO on CartPole-v1 in actors mode, a few updates
each, different seeds so no run can reuse another's result):

- ``fresh``: a slice reserved with ``keep_learners=False``; every run starts a learner
  process per chip, imports JAX in it, joins ``jax.distributed``, sets up and compiles
  (the compiled update comes from the disk cache after the first run).
- ``warm``: a slice reserved with ``keep_learners=True``; its learners are started in the
  background right after the reservation and warmed for the run's config
  (``wb.start_learners(tpu_slice, config)``, as the slice picker given the config does),
  then, after a pause standing for a notebook user writing the next cell, the runs follow
  one another on it, each taking the learners the run before it kept.
- ``warm_for_another_config``: the same, but warmed for the default config, and one run:
  a first run that its warm-up did not know (it still finds its processes up, joined and
  JAX warm, but traces and lowers its own programs).

For each run: ``startup_s`` (the call to the first update), its profile (seconds until the
learners had joined, were set up, and had compiled) and whether the learners were warm;
per side the median over the runs after the first (the first run of ``fresh`` also pays
for compiling); the ratio warm/fresh of those medians.

    .venv/bin/python benchmarks/bench_startup.py --runs 4 --pause-s 20
"""

from __future__ import annotations

import argparse
import time

import harness

import workbench as wb

RUN = dict(env="CartPole-v1", mode="actors", total_env_steps=3 * 1024, envs_per_chip=8,
           rollout_length=32, eval_every=0, eval_episodes=2)


def runs_on(tpu_slice, count: int, seed_base: int) -> list[dict]:
    records = []
    for k in range(count):
        with harness.timed() as call:
            result = wb.train(tpu_slice, wb.TrainConfig(seed=seed_base + k, **RUN))
        records.append({"seed": seed_base + k, "startup_s": result.startup_s,
                        "call_s": round(call.s, 3),
                        **result.startup_profile})
    return records


def side(records: list[dict]) -> dict:
    later = [r["startup_s"] for r in records[1:]] or [records[0]["startup_s"]]
    return {"runs": records, "first_startup_s": records[0]["startup_s"],
            "median_later_startup_s": harness.median(later)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4, help="runs per side")
    parser.add_argument("--pause-s", type=float, default=20.0,
                        help="seconds between the warm side's reservation and its first run")
    args = parser.parse_args()
    if args.runs < 1 or args.pause_s < 0:
        parser.error("--runs must be at least 1 and --pause-s at least 0")
    clock = harness.timed()
    with wb.local_cluster([("v6e", "2x2")]):
        cluster_s = clock.s
        with wb.reserve("v6e", "2x2", cpus_per_chip=2, keep_learners=False) as tpu_slice:
            fresh = side(runs_on(tpu_slice, args.runs, 100))
        with wb.reserve("v6e", "2x2", cpus_per_chip=2, keep_learners=True) as tpu_slice:
            wb.start_learners(tpu_slice, wb.TrainConfig(**RUN))
            time.sleep(args.pause_s)
            warm = side(runs_on(tpu_slice, args.runs, 200))
        with wb.reserve("v6e", "2x2", cpus_per_chip=2, keep_learners=True) as tpu_slice:
            wb.start_learners(tpu_slice)
            time.sleep(args.pause_s)
            other = runs_on(tpu_slice, 1, 300)[0]
    harness.print_result({
        "benchmark": "startup",
        "shape": "v6e 2x2 (simulated)",
        "run": RUN,
        "pause_s": args.pause_s,
        "cluster_start_s": round(cluster_s, 3),
        "fresh": fresh,
        "warm": warm,
        "warm_for_another_config": other,
        "ratio_warm_over_fresh": {
            "first_startup_s": harness.ratio(warm["first_startup_s"], fresh["first_startup_s"]),
            "median_later_startup_s": harness.ratio(warm["median_later_startup_s"],
                                                    fresh["median_later_startup_s"]),
        },
        "wall_s": round(clock.s, 1),
    })


if __name__ == "__main__":
    main()
