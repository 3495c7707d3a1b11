"""Actors mode with an environment that has no vectorised implementation (Acrobot-v1,
stepped one env at a time in Python): env-steps/s against the number of rollout actors
(one CPU each) per host of a simulated v6e 2x2, in one invocation.

    .venv/bin/python benchmarks/bench_rollout_cpus.py --repeats 3

One slice, its processes kept between runs (the rollout actors are laid out again when the
count changes). For each count in ``--actors-per-host`` the same run (PPO, a fixed env-step
budget, no target stop) is repeated; the peer is the same run in one plain process without
Ray (``train_in_process``), its one rollout worker stepping every env. Prints JSON with the
median env-steps/s of each and its ratio to the peer.
"""

from __future__ import annotations

import argparse

import harness

import workbench as wb
from workbench.engine import TrainConfig
from workbench.engine.in_process import train_in_process

RUN = dict(env="Acrobot-v1", mode="actors", envs_per_chip=16, rollout_length=64,
           eval_every=0, eval_episodes=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--env-steps", type=int, default=8 * 4 * 16 * 64,
                        help="env steps per run (default: 8 updates)")
    parser.add_argument("--actors-per-host", default="1,2,4")
    args = parser.parse_args()
    counts = [int(c) for c in args.actors_per_host.split(",") if c.strip()]
    if args.repeats < 1 or not counts or any(c not in (1, 2, 4) for c in counts):
        parser.error("--repeats must be at least 1 and --actors-per-host divisors of 4")
    clock = harness.timed()
    config = TrainConfig(total_env_steps=args.env_steps, **RUN)
    peer = [train_in_process(config.replace(seed=k), chips=4, evaluate=False).env_steps_per_s
            for k in range(args.repeats)]
    sides: dict[str, list[float]] = {}
    with wb.local_cluster([("v6e", "2x2")]), \
            wb.reserve("v6e", "2x2", cpus_per_chip=2, keep_learners=True) as tpu_slice:
        for count in counts:
            runs = [wb.train(tpu_slice, config.replace(seed=k, rollout_actors_per_host=count))
                    for k in range(args.repeats)]
            sides[str(count)] = [r.env_steps_per_s for r in runs]
    harness.print_result({
        "benchmark": "rollout_cpus",
        "run": {**RUN, "total_env_steps": args.env_steps},
        "one_process_env_steps_per_s": {"runs": [round(x, 1) for x in peer],
                                        "median": harness.median(peer, 1)},
        "slice_env_steps_per_s": {
            count: {"runs": [round(x, 1) for x in values],
                    "median": harness.median(values, 1),
                    "over_one_process": harness.median_ratio(values, peer)}
            for count, values in sides.items()
        },
        "wall_s": round(clock.s, 1),
    })


if __name__ == "__main__":
    main()
