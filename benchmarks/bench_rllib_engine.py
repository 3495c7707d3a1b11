"""The RLlib engine against plain RLlib: the same PPO config, the same budget, one
invocation, each run in its own subprocess (its whole process tree sampled for memory).

Sides (each seed runs all three, one after another):
  plain      RLlib's PPO as RLlib places it: ``ray.init(address="local")`` in a private
             temp dir, ``build_algo()``, one remote learner (``num_learners=1``).
  workbench1 the same config through ``wb.train_rllib`` on a simulated v6e 2x2, one learner
             on one chip (the same learner count as ``plain``).
  workbench4 the same on all four chips: four learners in RLlib's data-parallel group.

The config is RLlib's tuned CartPole PPO (``examples/algorithms/ppo/cartpole_ppo.py``: lr
3e-4, 6 epochs, vf_loss_coeff 0.01, a 32-unit linear network sharing value and policy
layers) with 2 env runners, seeded. Every side calls ``train()`` until ``--env-steps`` or
until RLlib's ``episode_return_mean`` reaches ``--target-return``; loop seconds are the
summed ``train()`` calls (checkpoints excluded on the workbench: one at the end).

Reported per side (medians over seeds): loop seconds, env steps, env-steps/s, time and env
steps to the target, cold start (plain: ``ray.init`` + ``build_algo``; workbench: simulated
cluster + reservation + the engine's start-up, which includes building the algorithm),
imports, peak RSS of the tree. Ratios: workbench1 over plain (the engine's overhead at the
same learner count; goal: env-steps/s at least 0.9 of plain's, i.e. at most 10% slower) and
workbench4 over workbench1 (what three more chips buy on this machine).

    .venv/bin/python benchmarks/bench_rllib_engine.py --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

import harness
from harness import (
    Invocation,
    Record,
    at_least,
    benchmark_parser,
    parse_seeds,
    process_age_s,
    ratio,
    rllib_algorithm,
    run_or_work,
    simulated_slice,
    timed,
)

SCRIPT = Path(__file__).resolve()
SIDES = ("plain", "workbench1", "workbench4")
GOAL_OVERHEAD = 0.10


def ppo_config(seed: int, learners: int) -> Any:
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    return (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=2)
        .learners(num_learners=learners)
        .training(lr=0.0003, num_epochs=6, vf_loss_coeff=0.01)
        .rl_module(model_config=DefaultModelConfig(
            fcnet_hiddens=[32], fcnet_activation="linear", vf_share_layers=True))
        .debugging(seed=seed)
    )


def plain_loop(algo: Any, env_steps: int, target: float) -> Record:
    from ray.rllib.utils.metrics import (
        ENV_RUNNER_RESULTS,
        EPISODE_RETURN_MEAN,
        NUM_ENV_STEPS_SAMPLED_LIFETIME,
    )

    loop_s, steps, iterations, hit, last = 0.0, 0, 0, None, None
    while steps < env_steps:
        with timed() as train_call:
            result = algo.train()
        loop_s += train_call.s
        iterations += 1
        runners = result[ENV_RUNNER_RESULTS]
        steps = int(runners[NUM_ENV_STEPS_SAMPLED_LIFETIME])
        mean = runners.get(EPISODE_RETURN_MEAN)
        last = None if mean is None or math.isnan(mean) else float(mean)
        if last is not None and last >= target:
            hit = (loop_s, steps)
            break
    return {"loop_s": round(loop_s, 3), "env_steps": steps, "updates": iterations,
            "final_return": last,
            "env_steps_per_s": round(steps / loop_s, 1) if loop_s else None,
            "time_to_train_target_s": None if hit is None else round(hit[0], 3),
            "env_steps_to_train_target": None if hit is None else hit[1]}


def plain_worker(seed: int, env_steps: int, target: float) -> Record:
    config = ppo_config(seed, learners=1)  # imports RLlib and torch before the clock
    imports_s = process_age_s()
    # A learner and two env runners: RLlib asks for a CPU each.
    with rllib_algorithm(config, num_cpus=4) as peer:
        record = plain_loop(peer.algo, env_steps, target)
    return {"side": "plain", "imports_s": round(imports_s, 3),
            "ray_init_s": round(peer.ray_init_s, 3), "cold_start_s": round(peer.cold_start_s, 3),
            **record}


def workbench_worker(seed: int, learners: int, env_steps: int, target: float) -> Record:
    import workbench as wb

    config = ppo_config(seed, learners)
    imports_s = process_age_s()
    with simulated_slice(read_chips=False) as simulated:
        run_dir = tempfile.mkdtemp(prefix="bench-rllib-engine-")
        try:
            options = wb.RLlibOptions(total_env_steps=env_steps, target_return=target,
                                      checkpoint_every=10**6, run_dir=run_dir)
            result = wb.train_rllib(simulated.tpu_slice, config, options)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
    cluster_start_s, reserve_s = simulated.cluster_start_s, simulated.reserve_s
    return {
        "side": f"workbench{learners}", "imports_s": round(imports_s, 3),
        "cluster_start_s": round(cluster_start_s, 3), "reserve_s": round(reserve_s, 3),
        "startup_s": round(result.startup_s, 3),
        "cold_start_s": round(cluster_start_s + reserve_s + result.startup_s, 3),
        "loop_s": round(result.wall_s, 3), "env_steps": result.env_steps,
        "updates": result.updates, "final_return": result.final_return,
        "env_steps_per_s": round(result.env_steps_per_s, 1),
        "time_to_train_target_s": result.time_to_train_target_s,
        "env_steps_to_train_target": result.env_steps_to_train_target,
        "learners": len(result.chip_state_digests),
        "chips_agree": len(set(result.chip_state_digests)) == 1,
    }


FIGURES = ("loop_s", "env_steps", "time_to_train_target_s", "env_steps_to_train_target",
           "cold_start_s", "imports_s", "peak_rss_mib", "tree_cpu_s")


def medians(records: list[Record]) -> Record:
    return harness.medians(records, FIGURES, (("target_reached", "time_to_train_target_s"),))


def summarize(runs: dict[str, list[Record]]) -> Record:
    median = {side: medians(records) for side, records in runs.items()}
    plain, one, four = (median[s] for s in SIDES)
    throughput = ratio(one["env_steps_per_s"], plain["env_steps_per_s"])
    return {
        "median": median,
        "ratios": {
            "env_steps_per_s_workbench1_over_plain": throughput,
            "loop_s_workbench1_over_plain": ratio(one["loop_s"], plain["loop_s"]),
            "cold_start_workbench1_over_plain": ratio(one["cold_start_s"],
                                                      plain["cold_start_s"]),
            "env_steps_per_s_workbench4_over_workbench1": ratio(four["env_steps_per_s"],
                                                                one["env_steps_per_s"]),
            "time_to_target_workbench4_over_workbench1": ratio(
                four["time_to_train_target_s"], one["time_to_train_target_s"]),
            "peak_rss_workbench1_over_plain": ratio(one["peak_rss_mib"], plain["peak_rss_mib"]),
        },
        "goals": {
            "engine_overhead_at_most_10_percent": {
                "env_steps_per_s_ratio": throughput, "need_at_least": 1 - GOAL_OVERHEAD,
                "met": at_least(throughput, 1 - GOAL_OVERHEAD),
            },
        },
    }


def run_benchmark(args: argparse.Namespace) -> Record:
    seeds = parse_seeds(args.seeds)
    invocation = Invocation(SCRIPT, "bench-rllib-engine-", args.worker_timeout_s,
                            args.startup_retries)
    options = ["--env-steps", str(args.env_steps), "--target-return", str(args.target_return)]
    runs: dict[str, list[Record]] = {side: [] for side in SIDES}
    for seed in seeds:
        for side in SIDES:
            record = invocation.run(side, seed, options)
            record.pop("rss_samples", None)
            runs[side].append(record)
    return {
        "benchmark": "rllib_engine",
        "env": "CartPole-v1",
        "seeds": seeds,
        "env_steps": args.env_steps,
        "target": f"RLlib's episode_return_mean >= {args.target_return:g}",
        **invocation.context(),
        **summarize(runs),
        "runs": runs,
    }


def work(args: argparse.Namespace) -> Record:
    if args.worker == "plain":
        return plain_worker(args.seed, args.env_steps, args.target_return)
    return workbench_worker(args.seed, int(args.worker[len("workbench"):]), args.env_steps,
                            args.target_return)


def main() -> None:
    parser = benchmark_parser(__doc__, SIDES, worker_timeout_s=1800.0)
    parser.add_argument("--env-steps", type=int, default=60_000, help="each run's budget")
    parser.add_argument("--target-return", type=float, default=150.0)
    run_or_work(parser.parse_args(), run_benchmark, work)


if __name__ == "__main__":
    main()
