"""A trained run's policy played outside training: greedy episodes, and one drawn as a GIF.

What ``workbench eval RUN_DIR`` runs. The policy, its algorithm and config come from the
run's newest checkpoint that checks out (:func:`workbench.engine.loading.load`); the env,
its keyword arguments and wrappers from the run's own record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workbench.engine.loading import LoadedPolicy, load


@dataclass(frozen=True)
class RunEnv:
    """How the run made its environment."""

    env: str
    mode: str
    env_kwargs: dict
    wrappers: tuple


def run_env(policy: LoadedPolicy, run_dir: str | Path) -> RunEnv:
    """The env of the run that ``policy`` came from (its ``run.json`` when there is one)."""
    config: dict[str, Any] = {}
    record = Path(run_dir) / "run.json"
    if record.is_file():
        config = json.loads(record.read_text()).get("config", {})
    return RunEnv(env=policy.env, mode=policy.meta.get("mode", config.get("mode", "actors")),
                  env_kwargs=dict(config.get("env_kwargs") or {}),
                  wrappers=tuple(config.get("wrappers") or ()))


def _jax_entry(spec: RunEnv):
    from workbench.envs import jax_env_entry, jax_env_ids

    if spec.mode == "anakin" or spec.env in jax_env_ids() or ":" in spec.env and \
            spec.env.split(":")[0] in ("gymnax", "brax", "craftax"):
        entry = jax_env_entry(spec.env)
        return entry.with_kwargs(**spec.env_kwargs) if spec.env_kwargs else entry
    return None


def greedy_returns(policy: LoadedPolicy, spec: RunEnv, episodes: int, seed: int) -> list[float]:
    """Returns of ``episodes`` greedy episodes on fresh envs (a JAX env as one program)."""
    from workbench.engine.plan import _gymnasium_spec
    from workbench.learn.evaluation import GreedyEvaluator

    entry = _jax_entry(spec)
    if entry is not None and not spec.wrappers:
        evaluator = GreedyEvaluator(spec.env, policy.agent, seed, entry.make)
    else:
        evaluator = GreedyEvaluator(_gymnasium_spec(spec.env, spec.env_kwargs), policy.agent,
                                    seed, None, spec.wrappers)
    return evaluator.evaluate(policy.params, episodes)


def episode_frames(policy: LoadedPolicy, spec: RunEnv, seed: int,
                   max_steps: int = 1000) -> list[np.ndarray]:
    """One greedy episode drawn frame by frame (the start state included).

    Raises:
        ValueError: the env draws no frames.
    """
    act = policy.greedy_policy()
    entry = _jax_entry(spec)
    if entry is not None:
        from workbench.envs.animation import episode_frames as jax_episode_frames

        env = entry.make()
        try:
            return jax_episode_frames(env, act, seed, max_steps)
        except (NotImplementedError, AttributeError) as error:
            raise ValueError(f"{env.id} draws no frames ({error}): leave out --gif.") from None
    return _gymnasium_frames(spec, act, seed, max_steps)


def _gymnasium_frames(spec: RunEnv, act, seed: int, max_steps: int) -> list[np.ndarray]:
    import gymnasium as gym

    from workbench.engine.plan import _gymnasium_spec
    from workbench.learn.rollout import wrapper_of

    try:
        env = gym.make(_gymnasium_spec(spec.env, spec.env_kwargs), render_mode="rgb_array")
    except (TypeError, gym.error.Error) as error:
        raise ValueError(f"{spec.env} draws no frames ({error}): leave out --gif.") from None
    for wrapper in spec.wrappers:
        env = wrapper_of(wrapper)(env)
    try:
        obs, _ = env.reset(seed=seed)
        first = env.render()
        if first is None:
            raise ValueError(f"{spec.env} draws no frames: leave out --gif.")
        frames = [np.asarray(first)]
        for _ in range(max_steps):
            action = np.asarray(act(np.asarray(obs, np.float32)))
            obs, _, terminated, truncated, _ = env.step(action if action.ndim else action.item())
            frames.append(np.asarray(env.render()))
            if terminated or truncated:
                break
    finally:
        env.close()
    return frames


def evaluate_run(run_dir: str | Path, episodes: int = 100, seed: int = 0,
                 gif: str | Path | None = None, fps: int = 30) -> dict:
    """Greedy episodes of a run's trained policy, and optionally one of them as a GIF.

    Args:
        run_dir: the run's folder (``TrainResult.run_dir``), or its checkpoints.
        episodes: how many greedy episodes.
        seed: seeds the episodes' start states.
        gif: write one episode's frames here.
        fps: the GIF's frames per second.

    Returns:
        ``env``, ``algo``, ``update``, ``env_steps``, ``episodes``, ``mean_return``,
        ``returns``, ``checkpoint`` and ``gif`` (the path written, or None).

    Raises:
        CheckpointError: nothing usable in ``run_dir``.
        ValueError: ``episodes`` below 1, or a GIF of an env that draws no frames.
    """
    from workbench.envs.animation import save_gif

    if not isinstance(episodes, int) or episodes < 1:
        raise ValueError(f"episodes must be a positive whole number, got {episodes!r}.")
    policy = load(run_dir)
    spec = run_env(policy, run_dir)
    returns = greedy_returns(policy, spec, episodes, seed)
    written = None
    if gif is not None:
        written = str(save_gif(episode_frames(policy, spec, seed), gif, fps=fps))
    return {
        "env": spec.env,
        "algo": policy.meta.get("algo"),
        "update": policy.update,
        "env_steps": policy.env_steps,
        "checkpoint": policy.path,
        "episodes": episodes,
        "mean_return": float(np.mean(returns)),
        "returns": [float(r) for r in returns],
        "gif": written,
    }
