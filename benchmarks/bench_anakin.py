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
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ppo_vs_rllib import (  # noqa: E402
    Record,
    code_revision,
    machine,
    medians,
    process_age_s,
    ratio,
    rllib_worker,
    run_worker,
    speedup_goal,
    workbench_worker,
)

JAX_CARTPOLE = "workbench/CartPole-v1"
SIMULATED_CHIPS = 4  # v6e 2x2
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


def single_process_run(slice_config: Any, chips: int = SIMULATED_CHIPS) -> Record:
    """``slice_config``'s run in this one process, no Ray
    (:func:`~workbench.engine.in_process.train_in_process`): one CPU device learns from
    every env of the ``chips`` chips (the same global batch and hyperparameters)."""
    from workbench.learn.platform import configure_jax_platform

    configure_jax_platform("cpu")
    from workbench.engine.in_process import train_in_process

    imports_s = process_age_s()
    done = train_in_process(slice_config, chips=chips)
    target_s = done.time_to_train_target_s
    return {
        "side": "single",
        "imports_s": round(imports_s, 3),
        "cold_start_s": round(done.startup_s, 3),
        "loop_s": round(done.loop_s, 3),
        "env_steps": done.env_steps,
        "updates": len(done.curve),
        "env_steps_per_s": round(done.env_steps_per_s, 1),
        "time_to_train_target_s": None if target_s is None else round(target_s, 3),
        "env_steps_to_train_target": None if done.train_target is None
        else done.train_target["env_steps"],
        "mean_return_100": done.curve[-1].get("mean_return_100") if done.curve else None,
        "final_return": done.final_return,
    }


def summarize(runs: dict[str, list[Record]]) -> Record:
    median = {kind: medians(records) for kind, records in runs.items() if records}
    anakin, single = median.get("anakin"), median.get("single")
    goals: Record = {}
    if anakin and single:
        slowdown = ratio(anakin["time_to_train_target_s"], single["time_to_train_target_s"])
        share = ratio(anakin["env_steps_per_s"], single["env_steps_per_s"])
        goals["anakin_time_to_target_within_2x_of_single_process"] = {
            "anakin_over_single": slowdown, "need_at_most": 2.0,
            "met": None if slowdown is None else slowdown <= 2.0}
        goals["anakin_env_steps_per_s_at_least_half_of_single_process"] = {
            "anakin_over_single": share, "need_at_least": 0.5,
            "met": None if share is None else share >= 0.5}
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
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise SystemExit(f"unknown --kinds {unknown}; choose from {', '.join(KINDS)}")
    log_dir = Path(tempfile.mkdtemp(prefix="bench-anakin-"))
    started = time.monotonic()
    before = machine()
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
            record = run_worker(kind, seed, options[kind], args.worker_timeout_s, log_dir,
                                args.startup_retries, script=Path(__file__).resolve())
            record.pop("curve", None)
            runs[kind].append(record)
    return {
        "benchmark": "anakin",
        "seeds": seeds,
        "env_steps_budget": args.env_steps,
        "code": code_revision(),
        "machine_before": before,
        "machine_after": machine(),
        "total_s": round(time.monotonic() - started, 1),
        "logs": str(log_dir),
        **summarize(runs),
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"which runs, comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--env-steps", type=int, default=500_000,
                        help="env-step budget of the workbench runs (they stop at the target)")
    parser.add_argument("--rllib-max-env-steps", type=int, default=300_000)
    parser.add_argument("--worker-timeout-s", type=float, default=3600.0)
    parser.add_argument("--startup-retries", type=int, default=2)
    parser.add_argument("--worker", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is None:
        print(json.dumps(run_benchmark(args), indent=1))
        return
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
    Path(args.out).write_text(json.dumps(record))


if __name__ == "__main__":
    main()
