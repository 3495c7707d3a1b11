"""Many whole training runs in one compiled program: a sweep's trials, vmapped on each chip.

PureJaxRL's trick across a slice: every trial (a seed, and the values of the swept
hyperparameters) is an independent Anakin run on one chip's worth of environments. The
trials are split over the chips of the mesh, and each chip steps its share together with
``vmap``, rollout and update alike, so 64 seeds cost one compile and run side by side.
Trials never talk to each other, so the program has no collectives.

A trial is exactly the run that :class:`~workbench.learn.anakin.AnakinLearner` makes on a
one-chip slice with the same seed and config: the same key tree, the same env batch, the
same update. Hyperparameters whose values only enter arithmetic (learning rates, discounts,
coefficients) are arguments of the program, one value per trial; anything that shapes the
program (widths, minibatch counts, switches) must be equal within one program.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.algos.base import LOCAL
from workbench.learn import keys as run_keys
from workbench.learn.anakin import init_envs, make_rollout
from workbench.learn.compile_cache import load_or_compile
from workbench.learn.learner import AXIS, AgentSpec, to_numpy


@dataclass(frozen=True)
class TrialsSetup:
    """What every chip of a sweep builds its program from (picklable)."""

    agent: AgentSpec
    """The algorithm, its config (the swept fields' values here are placeholders), the
    spaces, and one trial's number of updates."""
    jax_env: Any
    """Builds the JAX environment."""
    envs_per_trial: int
    rollout_length: int
    traced_fields: tuple[str, ...]
    """The algorithm config's fields whose values differ between trials."""
    values: tuple[tuple[float, ...], ...]
    """One row per trial: its values of ``traced_fields``."""
    seeds: tuple[int, ...]
    """One seed per trial."""
    eval_episodes: int = 20
    """Greedy episodes of each trial's final evaluation."""

    @property
    def num_trials(self) -> int:
        return len(self.seeds)


def trial_functions(setup: TrialsSetup):
    """``(init, step)`` of one trial, pure, for ``vmap``:

    - ``init(values, seed) -> (state, carry, update_keys)``;
    - ``step(values, state, carry, update_keys, update) -> (state, carry, metrics, ended)``

    where ``values`` are the trial's traced hyperparameters (a 1-D array) and ``ended``
    is ``[T, N]``: an episode's return on the step it ended, NaN elsewhere.
    """
    import jax

    spec, env = setup.agent, setup.jax_env()

    def agent_of(values):
        config = dataclasses.replace(
            spec.config, **{f: values[i] for i, f in enumerate(setup.traced_fields)})
        return spec.algorithm.build(config, spec.spaces, spec.num_updates)

    def init(values, seed):
        keys = run_keys.run_keys(seed)
        state = agent_of(values).init(keys.params)
        # The envs of chip 0 of a one-chip run.
        carry = init_envs(env, run_keys.env_key(keys, 0), setup.envs_per_trial)
        return state, carry, keys.updates

    def step(values, state, carry, update_keys, update):
        agent = agent_of(values)
        rollout = make_rollout(env, agent.act, setup.rollout_length)
        rollout_key, update_key = jax.random.split(jax.random.fold_in(update_keys, update))
        carry, trajectory, ended = rollout(agent.policy(state), carry,
                                           jax.random.fold_in(rollout_key, 0))
        state, metrics = agent.update(state, trajectory, update_key, LOCAL)
        return state, carry, metrics, ended

    return init, step


def traceable(setup: TrialsSetup) -> bool:
    """Whether the algorithm builds its agent with the swept fields as traced values (it
    does unless it reads one of them in Python, e.g. in an ``if``)."""
    import jax

    init, step = trial_functions(setup)
    values = np.zeros(len(setup.traced_fields), np.float32)
    try:
        state, carry, keys = jax.eval_shape(init, values, 0)
        jax.eval_shape(step, values, state, carry, keys, 0)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
            jax.errors.TracerIntegerConversionError, TypeError):
        return False
    return True


def bytes_per_trial(setup: TrialsSetup) -> int:
    """What one trial keeps on a chip: its state, its envs, and the trajectory an update
    learns from; the optimizer's temporaries roughly double the state."""
    import jax

    init, step = trial_functions(setup)
    values = np.zeros(len(setup.traced_fields), np.float32)
    state, carry, keys = jax.eval_shape(init, values, 0)
    _, _, _, ended = jax.eval_shape(step, values, state, carry, keys, 0)

    def size(tree) -> int:
        return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))

    spaces = setup.agent.spaces
    steps = setup.rollout_length * setup.envs_per_trial
    trajectory = steps * 4 * (int(np.prod(spaces.obs_shape)) + 8 + len(spaces.action_shape))
    return 3 * size(state) + size(carry) + trajectory + size(ended)


class TrialsLearner:
    """One chip's share of a sweep: its trials, stepped together on the mesh.

    Run in one process it holds every trial on the local devices; run by the engine as
    one Ray actor per chip after ``jax.distributed`` has joined the slice, the trials are
    split over every chip and each process reads back only its own.
    """

    def __init__(self, setup: TrialsSetup) -> None:
        import jax
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        self.setup = setup
        self.mesh = Mesh(np.array(jax.devices()), (AXIS,))
        self.num_chips = self.mesh.size
        per_chip = -(-setup.num_trials // self.num_chips)
        self.padded = per_chip * self.num_chips
        """Trials in the program: the last trial is repeated to fill every chip equally
        (the copies' results are dropped)."""
        self._split = NamedSharding(self.mesh, P(AXIS))
        init, step = trial_functions(setup)
        sharded = dict(mesh=self.mesh, check_vma=False)
        # keep_unused: a sweep without traced fields passes an empty value table, which jit
        # would drop from the program; the compile caches key on the program's text, and
        # without it a [n, 0] table's program matched a [n, 1] one's, then refused its input.
        self._init = jax.jit(jax.shard_map(jax.vmap(init), in_specs=(P(AXIS), P(AXIS)),
                                           out_specs=P(AXIS), **sharded), keep_unused=True)
        self._step = jax.jit(
            jax.shard_map(jax.vmap(step, in_axes=(0, 0, 0, 0, None)),
                          in_specs=(P(AXIS), P(AXIS), P(AXIS), P(AXIS), P()),
                          out_specs=(P(AXIS), P(AXIS), P(AXIS), P(AXIS)), **sharded),
            donate_argnums=(1, 2), keep_unused=True,
        )
        rows = list(setup.values) + [setup.values[-1]] * (self.padded - setup.num_trials)
        seeds = list(setup.seeds) + [setup.seeds[-1]] * (self.padded - setup.num_trials)
        self.values = self._global(np.asarray(rows, np.float32).reshape(self.padded, -1))
        seeds = self._global(np.asarray(seeds, np.int32))
        self.state, self.carry, self.update_keys = load_or_compile(
            self._init.lower(self.values, seeds))(self.values, seeds)
        self._compiled = None
        self.updates = 0
        self.local_trials = self._local_indices()
        """The trials whose results this process reads (its chips' share, padding left out)."""

    def _global(self, array: np.ndarray):
        import jax

        # Every process holds the whole table; each device takes its rows.
        return jax.make_array_from_callback(array.shape, self._split, lambda index: array[index])

    def _local_indices(self) -> list[int]:
        indices = []
        for shard in sorted(self.values.addressable_shards, key=lambda s: s.index[0].start):
            rows = range(*shard.index[0].indices(self.padded))
            indices.extend(i for i in rows if i < self.setup.num_trials)
        return indices

    def compile(self) -> float:
        """Compile the step ahead of the loop; returns the seconds it took."""
        import jax

        started = time.perf_counter()
        if self._compiled is None:
            update = jax.make_array_from_callback((), self._replicated(), lambda _: np.int32(0))
            self._compiled = load_or_compile(
                self._step.lower(self.values, self.state, self.carry, self.update_keys, update))
        return time.perf_counter() - started

    def _replicated(self):
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        return NamedSharding(self.mesh, P())

    def step(self) -> tuple[dict[int, dict[str, float]], dict[int, list[float]], float]:
        """One update of every trial. Returns, for this process's trials, each one's
        metrics and the returns of the episodes it finished, and the seconds it took."""
        import jax

        started = time.perf_counter()
        self.compile()
        update = jax.make_array_from_callback((), self._replicated(),
                                              lambda _: np.int32(self.updates))
        self.state, self.carry, metrics, ended = self._compiled(
            self.values, self.state, self.carry, self.update_keys, update)
        self.updates += 1
        metrics = {k: self._local_rows(v) for k, v in metrics.items()}
        ended = self._local_rows(ended)
        per_trial_metrics, per_trial_returns = {}, {}
        for row, trial in enumerate(self.local_trials):
            per_trial_metrics[trial] = {k: float(v[row]) for k, v in metrics.items()}
            finished = ended[row]
            per_trial_returns[trial] = [float(r) for r in finished[~np.isnan(finished)]]
        return per_trial_metrics, per_trial_returns, time.perf_counter() - started

    def _local_rows(self, array) -> np.ndarray:
        """This process's trials' rows of a trial-sharded array, padding dropped."""
        shards = sorted(array.addressable_shards, key=lambda s: s.index[0].start)
        rows = np.concatenate([np.asarray(s.data) for s in shards])
        return rows[: len(self.local_trials)]

    def final_returns(self) -> dict[int, float]:
        """The mean return of ``eval_episodes`` greedy episodes of each of this process's
        trials, all evaluated in one program; each trial's episodes start where a run of
        its seed evaluates (its key tree's evaluation key)."""
        import jax

        from workbench.learn.evaluation import make_greedy_evaluation

        if not self.local_trials:
            return {}
        spec = self.setup.agent
        agent = spec.algorithm.build(spec.config, spec.spaces, spec.num_updates)
        policies = jax.vmap(agent.policy)(jax.tree.map(self._local_rows, self.state))
        keys = np.stack([np.asarray(run_keys.run_keys(self.setup.seeds[t]).evaluation)
                         for t in self.local_trials])
        evaluate = jax.jit(jax.vmap(make_greedy_evaluation(self.setup.jax_env(), agent.greedy),
                                    in_axes=(0, 0, None)), static_argnums=2)
        returns = np.asarray(evaluate(to_numpy(policies), keys, self.setup.eval_episodes))
        return {trial: float(returns[row].mean()) for row, trial in enumerate(self.local_trials)}
