"""PPO on CartPole-v1: the workbench on a simulated v6e 2x2 slice against RLlib's PPO.

Prints one JSON object: a record per seed for each side, medians over seeds, ratios, and
whether the goals are met (workbench time to the training target <= 1/10 of RLlib's,
workbench env-steps/s >= 20x RLlib's, workbench cold start < 20 s).

    .venv/bin/python benchmarks/bench_ppo_vs_rllib.py --seeds 0,1,2

Both sides run in the same invocation on the same machine, one after the other, each in
its own subprocess (this same file, ``--worker rllib|workbench``), so that each is isolated
and the peak RSS of its whole process tree (sampled every 0.5 s, summed over the subprocess
and all its descendants) covers every process it started.

RLlib: ``PPOConfig`` exactly as RLlib's ``examples/algorithms/ppo/cartpole_ppo.py`` (new API
stack, torch, 2 EnvRunners, 4000 env steps per ``train()``), seeded with
``.debugging(seed=...)``, in a private local Ray instance (``ray.init(address="local")`` with
its own temp dir: it never joins another cluster). ``algo.train()`` runs until the training
target or ``--rllib-max-env-steps``.

Targets, the same for both sides:
  training target: mean return of the last 100 training episodes >= 475. For RLlib the
    benchmark keeps those 100 returns itself, from a callback that logs every finished
    episode's return: in Ray 2.60 ``env_runners/episode_return_mean`` is not a 100-episode
    moving window (each EnvRunner's window is reset at every iteration, and the
    EnvRunners' means are averaged), so it is reported beside, never used as the target.
  evaluation target: a 20-episode greedy (argmax) evaluation with mean return >= 475.
    RLlib's is run by this benchmark in the driver with ``algo.get_module()`` every
    ``--rllib-eval-every`` iterations (5: ~20k env steps, the workbench's cadence), and its
    time is excluded from RLlib's training-loop time; the workbench evaluates every 5
    updates on its own actor, concurrently with training.

Times to target are seconds of training loop (RLlib: summed ``train()`` calls; workbench:
from its loop start). Env-steps/s: env steps over those loop seconds. Cold start: RLlib
``ray.init`` + ``build_algo()``; workbench cluster start + reservation + ``startup_s``
(actors, jax.distributed, warm-up compile). Interpreter and import time (RLlib and torch,
or the workbench and JAX) is reported separately as ``imports_s``. ``tree_cpu_s`` is the
CPU time of the whole tree (approximate: a process's last 0.5 s before it exits is missed),
a figure that, unlike the times, does not grow when other work shares the machine.

Medians over seeds treat a target never reached as slower than any reached one; a median
that lands there is ``null``. The time-to-target ratios come with bounds: a run that never
got there took longer than its whole loop, so a goal can still be decided (``met``) when a
side ran out of budget; ``met`` is ``null`` only when the bounds leave it open.

A run whose Ray instance or simulated cluster fails to come up (on a loaded 2-core machine
Ray's own start-up deadlines can pass) is started again, ``--startup-retries`` times at
most; ``startup_attempts`` and ``failed_startup_s`` say so, and the figures are those of
the attempt that came up.
"""

from __future__ import annotations

import argparse
import math
from collections import deque
from pathlib import Path
from typing import Any

from harness import (
    WINDOW,
    Invocation,
    Record,
    at_least,
    benchmark_parser,
    code_revision,
    episode_returns,
    episode_returns_callback,
    finite_or_none,
    medians,
    parse_seeds,
    process_age_s,
    processes_outside_tree,
    ratio,
    rllib_algorithm,
    round_or_none,
    run_or_work,
    simulated_slice,
    speedup_goal,
    time_ratio_bounds,
    timed,
)

SCRIPT = Path(__file__).resolve()
TARGET_RETURN = 475.0
EVAL_EPISODES = 20
EVAL_SEED_OFFSET = 999_983
GOAL_TRAIN_TARGET_SPEEDUP = 10.0
GOAL_THROUGHPUT_RATIO = 20.0
GOAL_WORKBENCH_COLD_START_S = 20.0


def _field(point: Record | None, key: str) -> Any:
    return None if point is None else point[key]


# RLlib worker.


def rllib_config(seed: int) -> Any:
    """RLlib's tuned CartPole PPO (examples/algorithms/ppo/cartpole_ppo.py), seeded."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    return (
        PPOConfig()
        .environment("CartPole-v1")
        .framework("torch")
        .training(lr=0.0003, num_epochs=6, vf_loss_coeff=0.01)
        .rl_module(
            model_config=DefaultModelConfig(
                fcnet_hiddens=[32], fcnet_activation="linear", vf_share_layers=True
            )
        )
        .callbacks(episode_returns_callback())
        .debugging(seed=seed)
    )


def greedy_eval(module: Any, episodes: int, seed: int) -> float:
    """Mean return of ``episodes`` CartPole episodes with argmax actions, stepped together."""
    import gymnasium as gym
    import numpy as np
    import torch

    envs = [gym.make("CartPole-v1") for _ in range(episodes)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    returns = np.zeros(episodes)
    active = np.ones(episodes, dtype=bool)
    with torch.no_grad():
        while active.any():
            idx = np.flatnonzero(active)
            batch = {"obs": torch.as_tensor(obs[idx], dtype=torch.float32)}
            actions = module.forward_inference(batch)["action_dist_inputs"].argmax(-1).numpy()
            for i, action in zip(idx, actions, strict=True):
                obs[i], reward, terminated, truncated, _ = envs[i].step(int(action))
                returns[i] += reward
                active[i] = not (terminated or truncated)
    for env in envs:
        env.close()
    return float(returns.mean())


def rllib_loop(algo: Any, seed: int, max_env_steps: int, eval_every: int) -> Record:
    """``algo.train()`` until the training target or the budget; evaluations excluded."""
    from ray.rllib.utils.metrics import (
        ENV_RUNNER_RESULTS,
        EPISODE_RETURN_MEAN,
        NUM_ENV_STEPS_SAMPLED_LIFETIME,
    )

    recent: deque[float] = deque(maxlen=WINDOW)
    loop_s = eval_s = 0.0
    env_steps = iteration = episodes = 0
    train_hit = eval_hit = key_hit = None
    curve = []
    while env_steps < max_env_steps and train_hit is None:
        with timed() as train_call:
            result = algo.train()
        loop_s += train_call.s
        iteration += 1
        runners = result[ENV_RUNNER_RESULTS]
        env_steps = int(runners[NUM_ENV_STEPS_SAMPLED_LIFETIME])
        finished = episode_returns(runners)
        recent.extend(finished)
        episodes += len(finished)
        mean_100 = sum(recent) / WINDOW if len(recent) == WINDOW else None
        reported = runners.get(EPISODE_RETURN_MEAN)
        reported = None if reported is None or math.isnan(reported) else float(reported)
        point = {"iteration": iteration, "loop_s": round(loop_s, 3), "env_steps": env_steps}
        if train_hit is None and mean_100 is not None and mean_100 >= TARGET_RETURN:
            train_hit = point
        if key_hit is None and reported is not None and reported >= TARGET_RETURN:
            key_hit = point
        eval_return = None
        if eval_every and iteration % eval_every == 0:
            with timed() as evaluation:
                eval_return = greedy_eval(algo.get_module(), EVAL_EPISODES,
                                          seed + EVAL_SEED_OFFSET)
            eval_s += evaluation.s
            if eval_hit is None and eval_return >= TARGET_RETURN:
                eval_hit = point
        curve.append({**point, "episodes": episodes, "episodes_this_iteration": len(finished),
                      "mean_return_100": round_or_none(mean_100, 2),
                      "rllib_episode_return_mean": round_or_none(reported, 2),
                      "eval_return": eval_return})
    with timed() as evaluation:
        final_return = greedy_eval(algo.get_module(), EVAL_EPISODES, seed + EVAL_SEED_OFFSET)
    eval_s += evaluation.s
    return {
        "env_steps": env_steps,
        "iterations": iteration,
        "episodes": episodes,
        "loop_s": round(loop_s, 3),
        "eval_s_excluded": round(eval_s, 3),
        "env_steps_per_s": round(env_steps / loop_s, 1) if loop_s > 0 else None,
        "time_to_train_target_s": _field(train_hit, "loop_s"),
        "env_steps_to_train_target": _field(train_hit, "env_steps"),
        "time_to_eval_target_s": _field(eval_hit, "loop_s"),
        "env_steps_to_eval_target": _field(eval_hit, "env_steps"),
        "rllib_episode_return_mean_time_to_target_s": _field(key_hit, "loop_s"),
        "rllib_episode_return_mean_env_steps_to_target": _field(key_hit, "env_steps"),
        "final_return": final_return,
        "curve": curve,
    }


def rllib_worker(seed: int, max_env_steps: int, eval_every: int) -> Record:
    import ray

    config = rllib_config(seed)  # imports RLlib and torch before the clock starts
    imports_s = process_age_s()
    with rllib_algorithm(config, num_cpus=2) as peer:
        outside = peer.processes_outside_tree()
        record = rllib_loop(peer.algo, seed, max_env_steps, eval_every)
        outside += peer.processes_outside_tree()
    return {
        "side": "rllib",
        "ray_version": ray.__version__,
        "imports_s": round(imports_s, 3),
        "ray_init_s": round(peer.ray_init_s, 3),
        "build_s": round(peer.cold_start_s - peer.ray_init_s, 3),
        "cold_start_s": round(peer.cold_start_s, 3),
        "cold_start_with_imports_s": round(imports_s + peer.cold_start_s, 3),
        "ray_processes_outside_tree": sorted(set(outside)),
        **record,
    }


# Workbench worker.


def workbench_worker(seed: int, total_env_steps: int, mode: str = "actors",
                     env: str = "CartPole-v1") -> Record:
    from workbench.engine import TrainConfig, train

    imports_s = process_age_s()
    code = code_revision()
    outside: set[int] = set()
    with simulated_slice() as simulated:
        cluster = simulated.cluster

        def check_tree(_row: dict) -> None:
            if not outside:
                outside.update(processes_outside_tree(cluster.process_ids()))

        config = TrainConfig(env=env, mode=mode, total_env_steps=total_env_steps,
                             seed=seed, stop_at_target=True)
        result = train(simulated.tpu_slice, config, on_update=check_tree)
        outside.update(processes_outside_tree(cluster.process_ids()))
    record = result.to_json()
    curve = record.pop("curve")
    cluster_start_s, reserve_s = simulated.cluster_start_s, simulated.reserve_s
    cold_start_s = cluster_start_s + reserve_s + result.startup_s
    return {
        "side": "workbench",
        "commit": code["commit"],
        "workbench_modified": code["workbench_modified"],
        "imports_s": round(imports_s, 3),
        "cluster_start_s": round(cluster_start_s, 3),
        "reserve_s": round(reserve_s, 3),
        "cold_start_s": round(cold_start_s, 3),
        "cold_start_with_imports_s": round(imports_s + cold_start_s, 3),
        "cluster_processes_outside_tree": sorted(outside),
        "loop_s": result.wall_s,
        **record,
        "curve": [
            {k: row.get(k) for k in ("update", "env_steps", "mean_return_100",
                                     "mean_return_this_update")}
            for row in curve
        ],
    }


# Summary.


def summarize(rllib: list[Record], workbench: list[Record]) -> Record:
    rl, wb = medians(rllib), medians(workbench)
    train_goal = speedup_goal(rllib, workbench, "time_to_train_target_s",
                              GOAL_TRAIN_TARGET_SPEEDUP)
    eval_low, eval_high = time_ratio_bounds(rllib, workbench, "time_to_eval_target_s")
    ratios = {
        "time_to_train_target_rllib_over_workbench": ratio(rl["time_to_train_target_s"],
                                                           wb["time_to_train_target_s"]),
        "time_to_train_target_rllib_over_workbench_bounds": train_goal["ratio_bounds"],
        "time_to_eval_target_rllib_over_workbench": ratio(rl["time_to_eval_target_s"],
                                                          wb["time_to_eval_target_s"]),
        "time_to_eval_target_rllib_over_workbench_bounds": [finite_or_none(eval_low),
                                                            finite_or_none(eval_high)],
        "env_steps_to_train_target_rllib_over_workbench": ratio(
            rl["env_steps_to_train_target"], wb["env_steps_to_train_target"]),
        "env_steps_per_s_workbench_over_rllib": ratio(wb["env_steps_per_s"],
                                                      rl["env_steps_per_s"]),
        "cold_start_rllib_over_workbench": ratio(rl["cold_start_s"], wb["cold_start_s"]),
        "cold_start_workbench_over_rllib": ratio(wb["cold_start_s"], rl["cold_start_s"]),
        "peak_rss_workbench_over_rllib": ratio(wb["peak_rss_mib"], rl["peak_rss_mib"]),
    }
    throughput = ratios["env_steps_per_s_workbench_over_rllib"]
    cold = wb["cold_start_s"]
    goals = {
        "time_to_train_target_at_most_1_10_of_rllib": {
            "ratio": ratios["time_to_train_target_rllib_over_workbench"], **train_goal,
        },
        "env_steps_per_s_at_least_20x_rllib": {
            "ratio": throughput, "need": GOAL_THROUGHPUT_RATIO,
            "met": at_least(throughput, GOAL_THROUGHPUT_RATIO),
        },
        "workbench_cold_start_under_20_s": {
            "value_s": cold, "need_below_s": GOAL_WORKBENCH_COLD_START_S,
            "met": None if cold is None else cold < GOAL_WORKBENCH_COLD_START_S,
        },
    }
    return {"median": {"rllib": rl, "workbench": wb}, "ratios": ratios, "goals": goals}


def run_benchmark(args: argparse.Namespace) -> Record:
    seeds = parse_seeds(args.seeds)
    invocation = Invocation(SCRIPT, "bench-ppo-vs-rllib-", args.worker_timeout_s,
                            args.startup_retries)
    rllib, workbench = [], []
    for seed in seeds:
        rllib.append(invocation.run(
            "rllib", seed, ["--rllib-max-env-steps", str(args.rllib_max_env_steps),
                            "--rllib-eval-every", str(args.rllib_eval_every)]))
        workbench.append(invocation.run(
            "workbench", seed, ["--workbench-env-steps", str(args.workbench_env_steps)]))
    if not args.keep_curves:
        for record in rllib + workbench:
            record.pop("curve", None)
    return {
        "benchmark": "ppo_vs_rllib",
        "env": "CartPole-v1",
        "target_return": TARGET_RETURN,
        "train_target": f"mean return of the last {WINDOW} training episodes >= "
                        f"{TARGET_RETURN:g}",
        "eval_target": f"{EVAL_EPISODES}-episode greedy evaluation mean >= {TARGET_RETURN:g}",
        "seeds": seeds,
        "rllib_max_env_steps": args.rllib_max_env_steps,
        "rllib_eval_every_iterations": args.rllib_eval_every,
        "workbench_env_steps": args.workbench_env_steps,
        **invocation.context(),
        **summarize(rllib, workbench),
        "rllib": rllib,
        "workbench": workbench,
    }


def work(args: argparse.Namespace) -> Record:
    if args.worker == "rllib":
        return rllib_worker(args.seed, args.rllib_max_env_steps, args.rllib_eval_every)
    return workbench_worker(args.seed, args.workbench_env_steps)


def main() -> None:
    parser = benchmark_parser(__doc__, ("rllib", "workbench"))
    parser.add_argument("--rllib-max-env-steps", type=int, default=300_000)
    parser.add_argument("--rllib-eval-every", type=int, default=5,
                        help="RLlib iterations (4000 env steps each) between evaluations")
    parser.add_argument("--workbench-env-steps", type=int, default=500_000,
                        help="the workbench's total_env_steps budget")
    parser.add_argument("--keep-curves", action="store_true",
                        help="keep each run's per-iteration/per-update curve in the output")
    run_or_work(parser.parse_args(), run_benchmark, work)


if __name__ == "__main__":
    main()
