"""Greedy evaluation of a policy: episodes on fresh envs with the algorithm's ``greedy``.

A JAX environment is evaluated as one compiled program (every episode at once); any other
gymnasium environment is stepped from Python as a vector env. Both the rollout side and
the run's evaluator use this module, which is why it sits below both.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from workbench.learn import keys as run_keys
from workbench.learn.heap import release_freed_memory


def make_greedy_evaluation(env, greedy: Callable) -> Callable:
    """``evaluate(policy, key, episodes) -> returns[episodes]``: one episode on each of
    ``episodes`` fresh copies of the JAX env ``env`` with ``greedy(policy, obs)``, as one
    program (jit it with ``static_argnames="episodes"``).

    Runs ``env.max_episode_steps`` steps, by which every episode has ended; an episode's
    return stops counting on the step it ended. A greedy evaluation stepped from Python
    costs a dispatch per step, and the engine evaluates often enough for that to take a
    core away from the learners.
    """
    import jax
    import jax.numpy as jnp

    step_all = jax.vmap(env.step)

    def evaluate(policy, key, episodes: int):
        reset_key, step_key = jax.random.split(key)
        state, obs = jax.vmap(env.reset)(jax.random.split(reset_key, episodes))

        def one_step(carry, step_key):
            state, obs, running, total = carry
            state, obs, reward, terminated, truncated = step_all(
                state, greedy(policy, obs), jax.random.split(step_key, episodes)
            )
            total = total + jnp.where(running, reward, 0.0)
            return (state, obs, running & ~(terminated | truncated), total), None

        start = (state, obs, jnp.ones(episodes, bool), jnp.zeros(episodes, jnp.float32))
        (_, _, _, total), _ = jax.lax.scan(
            one_step, start, jax.random.split(step_key, env.max_episode_steps)
        )
        return total

    return evaluate


class GreedyEvaluator:
    """Greedy episodes of one environment for one agent, on fresh envs each time.

    Args:
        env_id: a gymnasium id or spec.
        agent: the :class:`~workbench.learn.learner.AgentSpec` whose ``greedy`` is used.
        seed: the run's seed; every evaluation starts from the same states, drawn from the
            run key tree's evaluation key.
        wrappers: gymnasium wrappers for every env, as the rollouts have them.
        jax_env: builds the JAX environment behind ``env_id`` when there is one; it is
            then evaluated as one compiled program.
    """

    def __init__(self, env_id, agent, seed: int, jax_env: Callable | None = None,
                 wrappers: tuple = ()) -> None:
        import jax

        self.env_id = env_id
        self.wrappers = wrappers
        self.agent = agent.build()
        self._key = run_keys.run_keys(seed).evaluation
        self._seed = run_keys.as_seed(self._key)
        self._greedy = jax.jit(self.agent.greedy)
        self._compiled_episodes = None
        if jax_env is not None:
            self._compiled_episodes = jax.jit(
                make_greedy_evaluation(jax_env(), self.agent.greedy), static_argnames="episodes"
            )

    def evaluate(self, policy, episodes: int = 20) -> list[float]:
        """Returns of ``episodes`` greedy episodes with ``policy`` (numpy pytree)."""
        if self._compiled_episodes is not None:
            totals = np.asarray(self._compiled_episodes(policy, self._key, episodes=episodes))
        else:
            totals = self._evaluate_stepped(policy, episodes)
        # Rare, and the first one compiles the greedy policy: a good moment to give back.
        release_freed_memory()
        return totals.astype(float).tolist()

    def prepare(self, episodes: int) -> None:
        """Compile the evaluation now (on a policy of zeros), so that the first one of a
        training loop does not compile beside the learners."""
        import jax

        # Zeros of the policy's shapes compile the same program; initialising the network
        # for real would compile each of its initialisers on its own, for seconds.
        state = jax.eval_shape(self.agent.init, jax.random.PRNGKey(0))
        shapes = jax.eval_shape(self.agent.policy, state)
        self.evaluate(jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes), episodes)

    def _evaluate_stepped(self, policy, episodes: int) -> np.ndarray:
        from workbench.learn.rollout import make_vector_env

        env = make_vector_env(self.env_id, episodes, self._seed, self.wrappers)
        obs, _ = env.reset(seed=self._seed)
        totals = np.zeros(episodes)
        running = np.ones(episodes, dtype=bool)
        try:
            while running.any():
                action = np.asarray(self._greedy(policy, np.asarray(obs, np.float32)))
                obs, reward, term, trunc, _ = env.step(action)
                totals += np.where(running, reward, 0.0)
                running &= ~(term | trunc)
        finally:
            env.close()
        return totals
