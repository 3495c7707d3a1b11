"""The algorithms and environment suites against their peers, in one invocation.

    .venv/bin/python benchmarks/bench_algorithms.py --seeds 0,1,2
    .venv/bin/python benchmarks/bench_algorithms.py --pairs pqn_cartpole --seeds 0
    .venv/bin/python benchmarks/bench_algorithms.py --seeds 0 --peer-max-loop-s 480

Each pair runs the workbench on a simulated v6e 2x2 and its peer on the same machine, one
seed after the other, every run in its own subprocess (this file, ``--worker``), with the
process tree's peak RSS and CPU time sampled as in ``bench_ppo_vs_rllib.py``.

  ppo_pendulum     PPO with a Gaussian policy on gymnasium's Pendulum-v1, actors mode;
                   peer: RLlib's PPO with its tuned Pendulum settings
                   (``examples/algorithms/ppo/pendulum_ppo.py``: 2 EnvRunners x 20 envs,
                   MeanStdFilter, batch 1024, minibatch 128, lr 2e-4, gamma 0.95,
                   lambda 0.5, relu). Target: last-100 mean >= -250.
  impala_cartpole  IMPALA with V-trace on gymnasium's CartPole-v1, actors mode, rollout
                   actors one update ahead (the reproducible lag); peer: RLlib's IMPALA with
                   its tuned CartPole settings (``examples/algorithms/impala/
                   cartpole_impala.py``: MeanStdFilter, batch 500, grad clip 40, lr 5e-4,
                   vf 0.05, no entropy, shared layers), with 2 EnvRunners x 16 envs and a
                   local learner so that it fits two CPUs. Target: last-100 mean >= 475.
  pqn_cartpole     PQN on the JAX port of CartPole-v1 in Anakin mode (PQN was made for
                   vectorised envs stepped on the chip: no replay buffer to keep on the
                   host); peer: RLlib's DQN with its tuned CartPole settings
                   (``examples/algorithms/dqn/cartpole_dqn.py``: prioritised replay 50k,
                   double and dueling Q, n-step 2-5, epsilon 1 -> 0.02 over 25k steps,
                   256 tanh units). Target: last-100 mean >= 475.
  ppo_minatar      PPO in Anakin mode on gymnax's Breakout-MinAtar; peer: the same
                   learner in one plain process (PureJaxRL-style) with the same global batch
                   and env steps. No target: the returns after the same env steps are
                   compared, and the time ratio (goal <= 2x).
  ppo_brax         likewise on brax's inverted_pendulum.

For the RLlib pairs, times are seconds of training loop (RLlib: summed ``train()`` calls,
with the last 100 episode returns kept by the benchmark from a callback; workbench: from its
loop start); goals: the workbench at least 10x faster to the target, within the peer's
env-step budget. Misses are reported as misses. An RLlib peer also stops after
``--peer-max-loop-s`` seconds of training (its record says which budget ended it); its time
to the target is then known only to exceed that, and the ratio's lower bound uses it.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from collections import deque
from pathlib import Path
from typing import Any

from harness import (
    WINDOW,
    Invocation,
    Record,
    at_most,
    benchmark_parser,
    episode_returns,
    episode_returns_callback,
    median_or_none,
    medians,
    parse_names,
    parse_seeds,
    process_age_s,
    ratio,
    rllib_algorithm,
    round_or_none,
    run_or_work,
    simulated_slice,
    single_process_run,
    speedup_goal,
    timed,
)

SCRIPT = Path(__file__).resolve()

GOAL_SPEEDUP = 10.0
GOAL_ANAKIN_SLOWDOWN = 2.0


def pendulum_ppo_config() -> Any:
    from workbench.algos.ppo import PPOConfig

    # A short horizon, many epochs, normalised observations and scaled rewards: the
    # settings the README's Algorithms section gives for Pendulum.
    return PPOConfig(learning_rate=1e-3, gamma=0.9, num_epochs=10, num_minibatches=32,
                     normalize_observations=True, scale_rewards=True, ent_coef=0.0)


def brax_ppo_config() -> Any:
    from workbench.algos.ppo import PPOConfig

    return PPOConfig(normalize_observations=True, scale_rewards=True)


# What each pair trains on the workbench side: TrainConfig fields, and the peer.
PAIRS: dict[str, Record] = {
    "ppo_pendulum": {
        "workbench": dict(env="Pendulum-v1", envs_per_chip=4, rollout_length=128,
                          target_return=-250.0, algo_config=pendulum_ppo_config),
        "peer": "rllib_ppo", "target": -250.0, "budget": 400_000,
    },
    "impala_cartpole": {
        "workbench": dict(env="CartPole-v1", algo="impala", policy_lag=1),
        "peer": "rllib_impala", "target": 475.0, "budget": 600_000,
    },
    "pqn_cartpole": {
        "workbench": dict(env="workbench/CartPole-v1", algo="pqn", mode="anakin"),
        "peer": "rllib_dqn", "target": 475.0, "budget": 1_000_000,
    },
    "ppo_minatar": {
        "workbench": dict(env="gymnax:Breakout-MinAtar", mode="anakin", stop_at_target=False),
        "peer": "single", "target": None, "budget": 1_000_000,
    },
    "ppo_brax": {
        "workbench": dict(env="brax:inverted_pendulum", mode="anakin", stop_at_target=False,
                          algo_config=brax_ppo_config),
        "peer": "single", "target": None, "budget": 500_000,
    },
}


def train_config(pair: str, seed: int, total_env_steps: int) -> Any:
    from workbench.engine import TrainConfig

    fields = dict(PAIRS[pair]["workbench"])
    if callable(fields.get("algo_config")):
        fields["algo_config"] = fields["algo_config"]()
    fields.setdefault("stop_at_target", True)
    return TrainConfig(seed=seed, total_env_steps=total_env_steps, eval_every=0, **fields)


# Workbench side.


def workbench_worker(pair: str, seed: int, total_env_steps: int) -> Record:
    from workbench.engine import train

    imports_s = process_age_s()
    config = train_config(pair, seed, total_env_steps)
    with simulated_slice() as simulated:
        result = train(simulated.tpu_slice, config)
    record = result.to_json()
    curve = record.pop("curve")
    record.pop("chip_state_digests", None)
    return {
        "side": "workbench",
        "imports_s": round(imports_s, 3),
        "cold_start_s": round(simulated.cluster_start_s + simulated.reserve_s
                              + result.startup_s, 3),
        "loop_s": result.wall_s,
        "mean_return_100": curve[-1].get("mean_return_100") if curve else None,
        **record,
    }


def single_worker(pair: str, seed: int, total_env_steps: int) -> Record:
    return single_process_run(train_config(pair, seed, total_env_steps))


# RLlib side.


def rllib_config(peer: str, seed: int) -> Any:
    """RLlib's tuned settings for each peer (see the module's docstring), seeded."""
    from ray.rllib.connectors.env_to_module import MeanStdFilter
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    if peer == "rllib_ppo":
        from ray.rllib.algorithms.ppo import PPOConfig

        config = (
            PPOConfig().environment("Pendulum-v1")
            .env_runners(num_env_runners=2, num_envs_per_env_runner=20,
                         env_to_module_connector=lambda env, spaces, device: MeanStdFilter())
            .training(train_batch_size_per_learner=1024, minibatch_size=128, lr=0.0002,
                      gamma=0.95, lambda_=0.5)
            .rl_module(model_config=DefaultModelConfig(fcnet_activation="relu"))
        )
    elif peer == "rllib_impala":
        from ray.rllib.algorithms.impala import IMPALAConfig

        config = (
            IMPALAConfig().environment("CartPole-v1")
            .env_runners(num_env_runners=2, num_envs_per_env_runner=16,
                         env_to_module_connector=lambda env, spaces, device: MeanStdFilter())
            .learners(num_learners=0)
            .training(train_batch_size_per_learner=500, grad_clip=40.0,
                      grad_clip_by="global_norm", lr=0.0005, vf_loss_coeff=0.05,
                      entropy_coeff=0.0)
            .rl_module(model_config=DefaultModelConfig(vf_share_layers=True))
        )
    elif peer == "rllib_dqn":
        from ray.rllib.algorithms.dqn import DQNConfig

        config = (
            DQNConfig().environment("CartPole-v1")
            .training(lr=0.0005, train_batch_size_per_learner=32,
                      replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer",
                                            "capacity": 50_000, "alpha": 0.6, "beta": 0.4},
                      n_step=(2, 5), double_q=True, dueling=True,
                      epsilon=[(0, 1.0), (25_000, 0.02)])
            .rl_module(model_config=DefaultModelConfig(
                fcnet_hiddens=[256], fcnet_activation="tanh", fcnet_bias_initializer="zeros_",
                head_fcnet_hiddens=[256], head_fcnet_bias_initializer="zeros_"))
        )
    else:
        raise ValueError(f"unknown peer {peer!r}")
    return (config.framework("torch").callbacks(episode_returns_callback())
            .debugging(seed=seed))


def rllib_loop(algo: Any, target: float, max_env_steps: int, max_loop_s: float) -> Record:
    """``algo.train()`` until the last 100 episodes' mean reaches ``target``, the env-step
    budget is spent, or ``max_loop_s`` seconds of training have passed (a miss is then a
    lower bound on the time to the target, and the run still reports its figures)."""
    from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME

    recent: deque[float] = deque(maxlen=WINDOW)
    loop_s = 0.0
    env_steps = iteration = 0
    hit = None
    mean_100 = None
    reported_at = 0.0
    while env_steps < max_env_steps and loop_s < max_loop_s and hit is None:
        with timed() as train_call:
            result = algo.train()
        loop_s += train_call.s
        iteration += 1
        runners = result[ENV_RUNNER_RESULTS]
        env_steps = int(runners.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, env_steps))
        recent.extend(episode_returns(runners))
        mean_100 = sum(recent) / WINDOW if len(recent) == WINDOW else None
        if mean_100 is not None and mean_100 >= target:
            hit = {"loop_s": round(loop_s, 3), "env_steps": env_steps}
        if loop_s - reported_at >= 30:  # a long peer run can be followed in its log
            reported_at = loop_s
            print(f"iteration {iteration}: {env_steps} env steps in {loop_s:.0f} s, "
                  f"last-100 mean {mean_100}", file=sys.stderr, flush=True)
    ended_by = ("target" if hit is not None
                else "env_step_budget" if env_steps >= max_env_steps else "time_budget")
    return {
        "ended_by": ended_by,
        "env_steps": env_steps,
        "iterations": iteration,
        "loop_s": round(loop_s, 3),
        "env_steps_per_s": round(env_steps / loop_s, 1) if loop_s > 0 else None,
        "time_to_train_target_s": None if hit is None else hit["loop_s"],
        "env_steps_to_train_target": None if hit is None else hit["env_steps"],
        "mean_return_100": round_or_none(mean_100, 2),
    }


def rllib_worker(pair: str, seed: int, max_env_steps: int, max_loop_s: float) -> Record:
    import ray

    config = rllib_config(PAIRS[pair]["peer"], seed)
    imports_s = process_age_s()
    with rllib_algorithm(config, num_cpus=2) as peer:
        record = rllib_loop(peer.algo, PAIRS[pair]["target"], max_env_steps, max_loop_s)
        outside = peer.processes_outside_tree()
    return {"side": PAIRS[pair]["peer"], "ray_version": ray.__version__,
            "imports_s": round(imports_s, 3), "cold_start_s": round(peer.cold_start_s, 3),
            "ray_processes_outside_tree": outside, **record}


# Summary.


def summarize_pair(pair: str, workbench: list[Record], peer: list[Record]) -> Record:
    wb, other = medians(workbench), medians(peer)
    for side, records in (("workbench", workbench), ("peer", peer)):
        figures = wb if side == "workbench" else other
        figures["mean_return_100"] = median_or_none(
            [r.get("mean_return_100") for r in records], lower_is_better=False)
        figures["env_steps"] = median_or_none([r.get("env_steps") for r in records])
        figures["loop_s"] = median_or_none([r.get("loop_s") for r in records])
    summary: Record = {"median": {"workbench": wb, PAIRS[pair]["peer"]: other}}
    if PAIRS[pair]["peer"] == "single":
        slowdown = ratio(wb["loop_s"], other["loop_s"])
        summary["goals"] = {"anakin_time_within_2x_of_one_process_for_the_same_env_steps": {
            "anakin_over_single": slowdown, "need_at_most": GOAL_ANAKIN_SLOWDOWN,
            "met": at_most(slowdown, GOAL_ANAKIN_SLOWDOWN)}}
        summary["ratios"] = {
            "env_steps_per_s_anakin_over_single": ratio(wb["env_steps_per_s"],
                                                        other["env_steps_per_s"])}
        return summary
    goal = speedup_goal(peer, workbench, "time_to_train_target_s", GOAL_SPEEDUP)
    # Both sides had the same budget: a workbench run that reached the target did so
    # within it.
    summary["goals"] = {
        "at_least_10x_faster_to_the_target_within_the_same_env_step_budget": goal}
    summary["ratios"] = {
        "time_to_train_target_peer_over_workbench": ratio(other["time_to_train_target_s"],
                                                          wb["time_to_train_target_s"]),
        "env_steps_per_s_workbench_over_peer": ratio(wb["env_steps_per_s"],
                                                     other["env_steps_per_s"]),
    }
    return summary


def run_benchmark(args: argparse.Namespace) -> Record:
    seeds = parse_seeds(args.seeds)
    pairs = parse_names(args.pairs, PAIRS, "--pairs")
    invocation = Invocation(SCRIPT, "bench-algorithms-", args.worker_timeout_s,
                            args.startup_retries, watch_code=False)
    results: Record = {}
    for pair in pairs:
        spec = PAIRS[pair]
        peer_kind = "single" if spec["peer"] == "single" else "rllib"
        runs: dict[str, list[Record]] = {"workbench": [], "peer": []}
        for seed in seeds:
            for side, kind in (("peer", peer_kind), ("workbench", "workbench")):
                record = invocation.run(kind, seed,
                                        ["--pair", pair, "--env-steps", str(spec["budget"]),
                                         "--peer-max-loop-s", str(args.peer_max_loop_s)])
                runs[side].append(record)
        results[pair] = {"target": spec["target"], "env_step_budget": spec["budget"],
                         **summarize_pair(pair, **runs),
                         "runs": runs}
    return {
        "benchmark": "algorithms",
        "seeds": seeds,
        **invocation.context(),
        "pairs": results,
    }


def work(args: argparse.Namespace) -> Record:
    worker = {"workbench": workbench_worker, "single": single_worker,
              "rllib": functools.partial(rllib_worker, max_loop_s=args.peer_max_loop_s)
              }[args.worker]
    return worker(args.pair, args.seed, args.env_steps)


def main() -> None:
    parser = benchmark_parser(__doc__, ("workbench", "single", "rllib"))
    parser.add_argument("--pairs", default=",".join(PAIRS),
                        help=f"which pairs, comma-separated, of {', '.join(PAIRS)}")
    parser.add_argument("--peer-max-loop-s", type=float, default=1800.0,
                        help="seconds of training after which an RLlib peer that has not "
                             "reached the target stops (a lower bound on its time)")
    parser.add_argument("--pair", choices=tuple(PAIRS), help=argparse.SUPPRESS)
    parser.add_argument("--env-steps", type=int, help=argparse.SUPPRESS)
    run_or_work(parser.parse_args(), run_benchmark, work, default=_json_default)


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return str(value)


if __name__ == "__main__":
    main()
