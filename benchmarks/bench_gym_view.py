"""The workbench's gymnasium view of a JAX environment against gymnasium's own functional
JAX wrapper, both stepping 64 CartPoles with random actions in this one process.

    .venv/bin/python benchmarks/bench_gym_view.py --repeats 3

Prints JSON: env-steps/s of each (median over repeats) and the ratio.
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import harness
import numpy as np

import workbench  # noqa: F401  (registers workbench/CartPole-v1)

PEER = "phys2d/CartPole-v1"  # gymnasium's FunctionalJaxVectorEnv
OURS = "workbench/CartPole-v1"


def steps_per_s(env_id: str, num_envs: int, steps: int) -> float:
    env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point")
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(50):  # compile and warm up
        env.step(rng.integers(0, 2, num_envs))
    with harness.timed() as clock:
        for _ in range(steps):
            obs, *_ = env.step(rng.integers(0, 2, num_envs))
            np.asarray(obs)
    return num_envs * steps / clock.s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    rates = {env_id: [steps_per_s(env_id, args.envs, args.steps) for _ in range(args.repeats)]
             for env_id in (PEER, OURS)}
    median = {env_id: harness.median(r, 1) for env_id, r in rates.items()}
    harness.print_result({
        "num_envs": args.envs,
        "env_steps_per_s_median": median,
        "workbench_over_gymnasium": harness.ratio(median[OURS], median[PEER], 2),
    })


if __name__ == "__main__":
    main()
