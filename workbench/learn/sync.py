"""How the chips of a slice stay equal, applied around any algorithm's update.

Two exact strategies, differing only in what crosses the interconnect:

- ``"gradients"``: each chip steps through minibatches of its own data and every gradient
  is averaged over chips (one all-reduce per minibatch, through the
  :class:`~workbench.algos.base.ChipMean` the update is handed). Compute scales with chips;
  right when a collective costs microseconds (ICI between TPU chips).
- ``"batch"``: the trajectories of all chips are gathered once per update; the first chip
  runs the update over the whole batch, so each gradient is the global-minibatch gradient,
  and hands its new state to the others (two collectives per update). Right when a
  collective costs milliseconds and the network is small, as with CPU processes sharing a
  few cores: the other chips' processes leave the cores to the one doing the work.

The strategy is chosen once, on the driver (:func:`resolve`), and recorded in the result.
Each chip's requests (to stop after this update, to checkpoint it) ride along in the
update's own collectives, so agreeing on them costs no extra round trip.
"""

from __future__ import annotations

from collections.abc import Callable

from workbench.algos.base import LOCAL, ChipMean, join_env_columns

STRATEGIES = ("gradients", "batch")
CHOICES = ("auto", *STRATEGIES)
REQUESTS = ("stop", "checkpoint")
"""What a chip can ask of the others after an update: one flag each, in this order."""


def resolve(requested: str, platform: str) -> str:
    """The strategy a run uses: ``requested``, or for ``"auto"`` ``"batch"`` on CPU learners
    (the simulated slice) and ``"gradients"`` on TPUs.

    Raises:
        ValueError: not one of ``auto``, ``gradients``, ``batch``.
    """
    if requested not in CHOICES:
        raise ValueError(f"sync must be 'auto', 'gradients' or 'batch', got {requested!r}.")
    if requested == "auto":
        return "batch" if platform == "cpu" else "gradients"
    return requested


def checks_replication(strategy: str) -> bool:
    """Whether JAX can prove statically that the strategy leaves every chip equal.

    NOTE: JAX cannot prove it for steps over a gathered batch, so the static check is off
    in that mode; the tests compare every chip's state digest instead.
    """
    return strategy != "batch"


def chip_update(update: Callable, strategy: str, axis: str) -> Callable:
    """``update(state, trajectory, key, chips)`` as each chip runs it inside the mesh:
    ``(state, trajectory, key, requests) -> (state, metrics, agreed)``.

    ``requests`` is this chip's flags (see :data:`REQUESTS`), an int array of that length
    (any leading axes of size one); ``agreed`` is a bool array of the same length, true on
    every chip where any chip asked.
    """
    if strategy == "gradients":
        return _averaged(update, axis)
    if strategy == "batch":
        return _gathered(update, axis)
    raise ValueError(f"sync strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}.")


def _averaged(update: Callable, axis: str) -> Callable:
    import jax
    import jax.numpy as jnp

    chips = ChipMean(axis)

    def run(state, trajectory, key, requests):
        # Each chip shuffles its own data, so each needs its own key.
        key = jax.random.fold_in(key, jax.lax.axis_index(axis))
        state, metrics = update(state, trajectory, key, chips)
        flags = jnp.asarray(requests, jnp.float32).reshape(len(REQUESTS))
        metrics = chips.mean({**metrics, "_requests": flags})
        return state, metrics, metrics.pop("_requests") > 0

    return run


def _gathered(update: Callable, axis: str) -> Callable:
    import jax
    import jax.numpy as jnp
    from jax.flatten_util import ravel_pytree

    def run(state, trajectory, key, requests):
        flags = jnp.asarray(requests, jnp.float32).reshape(len(REQUESTS))
        # NOTE: the first of the update's two collectives: every chip gets every chip's
        # trajectories (and requests) as one flat vector, since on CPU each collective
        # costs milliseconds whatever its size. Only the leader learns; the others wait
        # for the second, which hands them its result, so every chip ends with the same
        # state, bit for bit.
        chips = gather_from_chips((trajectory, flags), axis)
        trajectory = join_env_columns([t for t, _ in chips])
        agreed = jnp.max(jnp.stack([f for _, f in chips]), axis=0) > 0

        def learn():
            return update(state, trajectory, key, LOCAL)

        shapes = jax.eval_shape(learn)
        leader = jax.lax.axis_index(axis) == 0
        result = jax.lax.cond(
            leader, learn, lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        )
        # NOTE: the leader's result reaches every chip as the first row of an all-gather,
        # not as a sum with the others' zeros: among four processes sharing two cores, gloo
        # takes about 1 ms for an all-gather and 5 ms for an all-reduce (a ring all-reduce
        # makes twice the hops, each one waiting for a process to be scheduled).
        flat, unravel = ravel_pytree(result)
        state, metrics = unravel(jax.lax.all_gather(flat, axis)[0])
        return state, metrics, agreed

    return run


def gather_from_chips(tree, axis: str) -> list:
    """Every chip's ``tree``, in chip order, on every chip: one all-gather of one flat
    vector, however many leaves the tree has."""
    import jax
    from jax.flatten_util import ravel_pytree

    flat, unravel = ravel_pytree(tree)
    return [unravel(row) for row in jax.lax.all_gather(flat, axis)]


__all__ = ["CHOICES", "REQUESTS", "STRATEGIES", "ChipMean", "checks_replication", "chip_update",
           "resolve"]
