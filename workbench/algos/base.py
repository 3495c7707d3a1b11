"""The algorithm protocol: what every learning algorithm gives the rest of the workbench.

An algorithm is data plus pure functions. Its :class:`Algorithm` record names a config
dataclass and a ``build`` function; ``build(config, spaces, num_updates)`` returns an
:class:`Agent`, four pure functions on pytrees:

- ``init(key) -> state``: the learner state (parameters, optimizer state, anything else);
- ``policy(state) -> policy``: what acting needs of the state (usually the parameters);
- ``act(policy, obs, key) -> (actions, extras)``: sampling for rollouts, for a batch of
  observations; ``extras`` is a dict of per-env arrays the update wants back (for PPO the
  behaviour log-probability and value);
- ``greedy(policy, obs) -> actions``: the evaluation policy;
- ``update(state, trajectory, key, chips) -> (state, metrics)``: one learning step from a
  time-major :class:`Trajectory`.

``chips`` is a :class:`ChipMean`. It is how an update averages over the chips that learn
together, and the only thing an algorithm knows of them: the learn layer decides how chips
stay equal (averaging gradients, or gathering the batch onto one chip) and hands in a
``ChipMean`` that averages across chips or does nothing. An algorithm never imports Ray,
never sees a device and never picks a sync strategy.

Nothing here imports JAX at module level, so the registry can be read without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

Pytree = Any

DISCRETE = "discrete"
CONTINUOUS = "continuous"
ACTIVATION_NAMES = ("tanh", "relu", "gelu", "silu")
"""Activations the built-in networks take by name (see :mod:`workbench.algos.networks`)."""


@dataclass(frozen=True)
class Spaces:
    """The observation and action spaces an algorithm builds its networks for."""

    obs_shape: tuple[int, ...]
    """Shape of one observation (observations are float32)."""
    action_kind: str
    """``"discrete"`` or ``"continuous"``."""
    num_actions: int = 0
    """Number of discrete actions (discrete spaces)."""
    action_shape: tuple[int, ...] = ()
    """Shape of one continuous action (continuous spaces)."""
    action_low: tuple[float, ...] = ()
    """Lower bounds of a continuous action, one per component."""
    action_high: tuple[float, ...] = ()
    """Upper bounds of a continuous action, one per component."""

    def describe(self) -> str:
        if self.action_kind == DISCRETE:
            return f"observations {self.obs_shape}, {self.num_actions} discrete actions"
        return f"observations {self.obs_shape}, continuous actions {self.action_shape}"


class RunningStats(NamedTuple):
    """Count, mean and variance of what has been seen (see :mod:`workbench.algos.normalize`)."""

    count: Any
    mean: Any
    var: Any


class Trajectory(NamedTuple):
    """A time-major rollout ``[T, N, ...]`` of ``N`` envs with next-step autoreset.

    ``valid`` is False on the step where an env that finished on the previous step was
    reset: that step's action was ignored by the env, so it is left out of any loss.
    ``last_obs`` is what the envs show after the last step, for bootstrapping.
    """

    obs: Any
    actions: Any
    rewards: Any
    terminated: Any
    truncated: Any
    valid: Any
    extras: dict
    """What ``act`` returned beside the actions, per step (e.g. ``log_prob``, ``value``)."""
    last_obs: Any


def join_env_columns(parts: list[Trajectory], concatenate: Callable | None = None) -> Trajectory:
    """Trajectories of several env batches as one, side by side: the env axis is 1 for the
    time-major fields and 0 for ``last_obs``.

    Args:
        parts: trajectories with the same fields and time length.
        concatenate: ``numpy.concatenate`` for host arrays; JAX's by default.
    """
    import jax

    if concatenate is None:
        import jax.numpy as jnp

        concatenate = jnp.concatenate
    steps = jax.tree.map(lambda *xs: concatenate(xs, axis=1),
                         *[p._replace(last_obs=None) for p in parts])
    return steps._replace(last_obs=concatenate([p.last_obs for p in parts], axis=0))


@dataclass(frozen=True)
class ChipMean:
    """Averaging over the chips that learn from one batch together.

    Built by the learn layer; ``ChipMean(None)`` (one chip, or a chip that learns from the
    whole gathered batch) averages nothing.
    """

    axis_name: str | None = None

    def mean(self, tree: Pytree) -> Pytree:
        """``tree`` averaged over the chips, as one all-reduce of one flat vector."""
        if self.axis_name is None:
            return tree
        import jax
        from jax.flatten_util import ravel_pytree

        # NOTE: one collective however many leaves: across hosts each collective costs a
        # round trip, so a per-leaf mean would multiply the latency by the leaf count.
        flat, unravel = ravel_pytree(tree)
        return unravel(jax.lax.pmean(flat, self.axis_name))

    def sum(self, tree: Pytree) -> Pytree:
        """``tree`` summed over the chips (one all-reduce of one flat vector)."""
        if self.axis_name is None:
            return tree
        import jax
        from jax.flatten_util import ravel_pytree

        flat, unravel = ravel_pytree(tree)
        return unravel(jax.lax.psum(flat, self.axis_name))

    def value_and_grad(self, fn: Callable, has_aux: bool = False) -> Callable:
        """``jax.value_and_grad(fn)`` whose gradient is averaged over the chips.

        The value (and aux) stay this chip's own.
        """
        import jax

        grad_fn = jax.value_and_grad(fn, has_aux=has_aux)
        if self.axis_name is None:
            return grad_fn
        axis = self.axis_name

        def averaged(params, *args, **kwargs):
            # NOTE: params are the same on every chip, but this chip's gradient is not;
            # without the cast, differentiating replicated params would sum every chip's
            # gradient (per leaf) before the mean below.
            value, grads = grad_fn(jax.lax.pcast(params, axis, to="varying"), *args, **kwargs)
            return value, self.mean(grads)

        return averaged


LOCAL = ChipMean(None)


class Agent(NamedTuple):
    """The pure functions an algorithm builds for one pair of spaces; see the module doc."""

    init: Callable[[Any], Pytree]
    policy: Callable[[Pytree], Pytree]
    act: Callable[[Pytree, Any, Any], tuple[Any, dict]]
    greedy: Callable[[Pytree, Any], Any]
    update: Callable[[Pytree, Trajectory, Any, ChipMean], tuple[Pytree, dict]]


@dataclass(frozen=True)
class Algorithm:
    """A learning algorithm as the registry holds it.

    A user's own algorithm is one of these, registered with
    :func:`workbench.algos.register` (from a notebook cell too: Ray ships it to the chips).
    """

    name: str
    """The name ``--algo`` and ``TrainConfig.algo`` use."""
    config_type: type
    """A frozen dataclass of hyperparameters with a docstring per field, and optionally a
    ``validate(batch_size)`` method that raises ``ValueError`` naming the field."""
    build: Callable[[Any, Spaces, int], Agent]
    """``build(config, spaces, num_updates) -> Agent``."""
    action_kinds: tuple[str, ...] = (DISCRETE,)
    """The action spaces it handles."""
    summary: str = ""
    """One line for listings."""

    def default_config(self) -> Any:
        return self.config_type()

    def check(self, config: Any, spaces: Spaces, env: str, batch_size: int) -> None:
        """Refuse, before anything starts, a config or a space this algorithm cannot use.

        Raises:
            ValueError: naming the field, or the env and the spaces that are supported.
        """
        if not isinstance(config, self.config_type):
            raise ValueError(
                f"algorithm {self.name!r} takes a {self.config_type.__name__}, got "
                f"{type(config).__name__}."
            )
        if spaces.action_kind not in self.action_kinds:
            raise ValueError(
                f"{env} has {spaces.action_kind} actions, and {self.name} handles "
                f"{' and '.join(self.action_kinds)} actions only: pick an algorithm that "
                f"supports them (workbench.algos.names(action_kind={spaces.action_kind!r}))."
            )
        validate = getattr(config, "validate", None)
        if callable(validate):
            validate(batch_size)


def config_fields(config_type: type) -> dict[str, dataclasses.Field]:
    """The init fields of an algorithm config dataclass, by name."""
    return {f.name: f for f in dataclasses.fields(config_type) if f.init}


def check_fields(config: Any, rules: Mapping[str, str]) -> None:
    """Validate numeric fields of ``config`` by simple rules, naming the first that fails.

    Rules: ``"positive"`` (> 0), ``"positive_int"``, ``"unit"`` (0 <= x <= 1),
    ``"non_negative"`` (>= 0).

    Raises:
        ValueError: ``"<field> must be ..., got <value>."``
    """
    import math

    for name, rule in rules.items():
        value = getattr(config, name)
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        finite = numeric and math.isfinite(value)
        if rule == "positive_int":
            ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
            wanted = "a positive whole number"
        elif rule == "positive":
            ok, wanted = finite and value > 0, "a finite number > 0"
        elif rule == "unit":
            ok, wanted = finite and 0 <= value <= 1, "a number from 0 to 1"
        elif rule == "non_negative":
            ok, wanted = finite and value >= 0, "a finite number >= 0"
        else:
            raise ValueError(f"unknown rule {rule!r} for {name}")
        if not ok:
            raise ValueError(f"{name} must be {wanted}, got {value!r}.")


def check_widths(name: str, sizes: Any) -> None:
    """Raise ``ValueError`` unless ``sizes`` is a non-empty tuple of positive widths."""
    if (not isinstance(sizes, tuple) or not sizes
            or not all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in sizes)):
        raise ValueError(
            f"{name} must be a non-empty tuple of positive widths such as (64, 64), got "
            f"{sizes!r}."
        )


def check_minibatches(num_minibatches: int, batch_size: int) -> None:
    """Raise ``ValueError`` if a chip's batch cannot be cut into ``num_minibatches``."""
    if batch_size < num_minibatches:
        raise ValueError(
            f"num_minibatches={num_minibatches} does not fit a batch of {batch_size} env "
            "steps per chip (envs_per_chip x rollout_length): use at most "
            f"{batch_size} minibatches, or more envs or a longer rollout."
        )


def check_choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}.")
