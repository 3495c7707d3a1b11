"""Anakin PPO on CartPole: on a simulated slice, in one plain process, against the
actors mode and RLlib's PPO, all in one invocation on the same machine.

    .venv/bin/python benchmarks/bench_anakin.py --seeds 0,1,2

Four runs per seed, each in its own subprocess (this file, ``--worker KIND``), with the
whole process tree's peak RSS and CPU time sampled as in ``bench_ppo_vs_rllib.py``:

  anakin  ``workbench train --mode anakin --env workbench/CartPole-v1`` on a simulated v6e
          2x2: four learner processes joined by jax.distributed, each stepping 16 JAX
          CartPoles on its "chip", rollout and update in one compiled program.
  single  the same ``AnakinLearner`` in one plain process without Ray, with the same
          global batch (64 envs x 64 steps) and PPO hyperparameters: the ceiling on this
          CPU, what spreading over chips is measured against.
  actors  the actors mode with gymnasium's CartPole-v1 on the same simulated slice.
  actors_single
          the actors mode's own limit: the same gymnasium vector envs (all four chips'
          envs in one), the same policy forward, the same update and policy lag, in one
          process without Ray (``workbench.engine.in_process.train_in_process``).
  rllib   RLlib's PPO with its tuned CartPole settings (needs the ``rllib`` extra).

Targets as in the engine: the training target is a mean of the last 100 training episodes
>= 475; times are seconds of training loop from its start (cold start, which includes the
compile, is reported apart). Goals: Anakin's time to the target within 2x of the single
process's and its env-steps/s at least half of it; Anakin at least 30x faster to the
target than RLlib; the actors mode at least 0.7x of its one-process peer's env-steps/s, and
its time to the target at most 1/0.7 of the peer's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench_ppo_vs_rllib import rllib_worker, workbench_worker
from harness import (
    Invocation,
    Record,
    at_least,
    at_most,
    benchmark_parser,
    medians,
    parse_names,
    parse_seeds,
    ratio,
    run_or_work,
    single_process_run,
    speedup_goal,
)

SCRIPT = Path(__file__).resolve()
JAX_CARTPOLE = "workbench/CartPole-v1"
KINDS = ("anakin", "single", "actors", "actors_single", "rllib")


def single_worker(seed: int, total_env_steps: int) -> Record:
    """Anakin PPO on the JAX CartPole in one plain process, the slice's global batch."""
    from workbench.engine import TrainConfig

    return single_process_run(TrainConfig(env=JAX_CARTPOLE, mode="anakin", seed=seed,
                                          total_env_steps=total_env_steps))


def actors_single_worker(seed: int, total_env_steps: int) -> Record:
    """The actors mode in one plain process: one rollout worker stepping the four chips'
    gymnasium CartPoles, one learner on one CPU device, no Ray."""
    from workbench.engine import TrainConfig

    record = single_process_run(TrainConfig(env="CartPole-v1", mode="actors", seed=seed,
                                            total_env_steps=total_env_steps,
                                            stop_at_target=True))
    return {**record, "side": "actors_single"}


def summarize(runs: dict[str, list[Record]]) -> Record:
    median = {kind: medians(records) for kind, records in runs.items() if records}
    anakin, single = median.get("anakin"), median.get("single")
    goals: Record = {}
    if anakin and single:
        slowdown = ratio(anakin["time_to_train_target_s"], single["time_to_train_target_s"])
        share = ratio(anakin["env_steps_per_s"], single["env_steps_per_s"])
        goals["anakin_time_to_target_within_2x_of_single_process"] = {
            "anakin_over_single": slowdown, "need_at_most": 2.0,
            "met": at_most(slowdown, 2.0)}
        goals["anakin_env_steps_per_s_at_least_half_of_single_process"] = {
            "anakin_over_single": share, "need_at_least": 0.5,
            "met": at_least(share, 0.5)}
    actors, actors_single = median.get("actors"), median.get("actors_single")
    if actors and actors_single:
        share = ratio(actors["env_steps_per_s"], actors_single["env_steps_per_s"])
        time_share = ratio(actors_single["time_to_train_target_s"],
                           actors["time_to_train_target_s"])
        goals["actors_at_least_0.7x_of_its_one_process_peer"] = {
            "env_steps_per_s_actors_over_peer": share,
            "time_to_target_peer_over_actors": time_share, "need_at_least": 0.7,
            "met": None if share is None or time_share is None
            else share >= 0.7 and time_share >= 0.7}
    if anakin and runs.get("rllib"):
        goal = speedup_goal(runs["rllib"], runs["anakin"], "time_to_train_target_s", 30.0)
        goals["anakin_at_least_30x_faster_to_target_than_rllib"] = goal
    ratios = {
        f"env_steps_per_s_{kind}_over_rllib": ratio(m["env_steps_per_s"],
                                                    median["rllib"]["env_steps_per_s"])
        for kind, m in median.items() if kind != "rllib" and "rllib" in median
    }
    if anakin and "actors" in median:
        ratios["time_to_train_target_actors_over_anakin"] = ratio(
            median["actors"]["time_to_train_target_s"], anakin["time_to_train_target_s"])
    return {"median": median, "ratios": ratios, "goals": goals}


def run_benchmark(args: argparse.Namespace) -> Record:
    seeds = parse_seeds(args.seeds)
    kinds = parse_names(args.kinds, KINDS, "--kinds")
    invocation = Invocation(SCRIPT, "bench-anakin-", args.worker_timeout_s,
                            args.startup_retries, watch_code=False)
    runs: dict[str, list[Record]] = {kind: [] for kind in kinds}
    options = {
        "anakin": ["--env-steps", str(args.env_steps)],
        "single": ["--env-steps", str(args.env_steps)],
        "actors": ["--env-steps", str(args.env_steps)],
        "actors_single": ["--env-steps", str(args.env_steps)],
        "rllib": ["--rllib-max-env-steps", str(args.rllib_max_env_steps)],
    }
    for seed in seeds:
        for kind in kinds:
            record = invocation.run(kind, seed, options[kind])
            record.pop("curve", None)
            runs[kind].append(record)
    return {
        "benchmark": "anakin",
        "seeds": seeds,
        "env_steps_budget": args.env_steps,
        **invocation.context(),
        **summarize(runs),
        "runs": runs,
    }


def work(args: argparse.Namespace) -> Record:
    if args.worker == "anakin":
        record = workbench_worker(args.seed, args.env_steps, mode="anakin", env=JAX_CARTPOLE)
    elif args.worker == "actors":
        record = workbench_worker(args.seed, args.env_steps)
    elif args.worker == "single":
        record = single_worker(args.seed, args.env_steps)
    elif args.worker == "actors_single":
        record = actors_single_worker(args.seed, args.env_steps)
    else:
        record = rllib_worker(args.seed, args.rllib_max_env_steps, eval_every=5)
    record["side"] = args.worker
    return record


def main() -> None:
    parser = benchmark_parser(__doc__, KINDS)
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"which runs, comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--env-steps", type=int, default=500_000,
                        help="env-step budget of the workbench runs (they stop at the target)")
    parser.add_argument("--rllib-max-env-steps", type=int, default=300_000)
    run_or_work(parser.parse_args(), run_benchmark, work)


if __name__ == "__main__":
    main()
