"""What every chip's learner shares, whichever mode it runs in.

A learner is plain Python. Run in one process it uses the local devices; run by the train
layer as one Ray actor per chip, after ``jax.distributed`` has joined every chip of a slice,
its mesh spans the whole slice and the same update keeps every chip equal. Both modes
(:mod:`workbench.learn.actors_mode`, :mod:`workbench.learn.anakin`) expose the same
``compile()`` and ``step(stop)``, so the layer above never asks which mode it runs.

The same learner can also be built over a given list of devices without running anything
(``abstract=True``): its state, environments and inputs are then shapes with shardings, and
its programs (:meth:`ChipLearner.programs`) lower for those devices. This is how the
programs a TPU slice would run are compiled on a machine without one
(:mod:`workbench.learn.ahead`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from workbench.algos.base import Agent, Algorithm, Spaces
from workbench.learn import keys as run_keys
from workbench.learn import sync
from workbench.learn.compile_cache import kept_in_memory, load_or_compile

AXIS = "chips"


@dataclass(frozen=True)
class AgentSpec:
    """Everything needed to build an algorithm's agent in any process (picklable)."""

    algorithm: Algorithm
    config: Any
    spaces: Spaces
    num_updates: int

    def build(self) -> Agent:
        return self.algorithm.build(self.config, self.spaces, self.num_updates)


@dataclass(frozen=True)
class LearnerSetup:
    """What one chip's learner is built from; the same on every chip of a slice."""

    agent: AgentSpec
    seed: int
    """The run's seed: its key tree (:mod:`workbench.learn.keys`) seeds everything."""
    sync: str
    """``"gradients"`` or ``"batch"`` (see :mod:`workbench.learn.sync`), resolved already."""
    envs_per_chip: int
    rollout_length: int
    jax_env: Callable[[], Any] | None = None
    """Builds the JAX environment (Anakin mode)."""
    policy_lag: int = 1
    """Actors mode: how many updates ahead the rollout actors run (see actors_mode)."""


@dataclass(frozen=True)
class StepOutcome:
    """What one update of one chip reports."""

    metrics: dict[str, float]
    stop: bool
    """Every chip agreed to stop after this update."""
    checkpoint: bool
    """Every chip agreed that this update is checkpointed (see :meth:`ChipLearner.resume_state`)."""
    step_s: float
    env_steps: int
    """Env steps this update learned from, over all chips."""
    episode_returns: tuple[float, ...] = ()
    """Returns of the episodes this chip's envs finished."""
    policy_versions: tuple[int, ...] = field(default_factory=tuple)
    """The policy version of each batch learned from."""


LOWERED_KEPT = 8
"""Lowered learner programs a process keeps (see :meth:`ChipLearner._lowered`)."""
_lowered_programs: OrderedDict = OrderedDict()


def program_identity(setup: LearnerSetup) -> bytes | None:
    """What a learner's programs are lowered from: its setup with the seed left out, as a
    digest; ``None`` when the setup cannot be pickled here (an algorithm or env defined in a
    notebook arrives by value), and then nothing is reused."""
    try:
        return hashlib.sha256(pickle.dumps(dataclasses.replace(setup, seed=0))).digest()
    except (pickle.PicklingError, AttributeError, TypeError):
        return None


def to_numpy(tree):
    """A host copy of a (replicated) pytree of arrays, read from this process's devices."""
    import jax

    def host(x):
        return np.asarray(x.addressable_data(0) if hasattr(x, "addressable_data") else x)

    return jax.tree.map(host, tree)


class ChipLearner:
    """A mesh over every chip, the agent's state replicated on it, the update wrapped by
    the sync strategy, the run's key tree, and the state to and from the host."""

    host_rollouts: ClassVar[bool] = False
    """Whether the mode needs rollout actors on the hosts' CPUs."""
    env_kind: ClassVar[str] = "gymnasium"
    """``gymnasium`` (any registered id) or ``jax`` (a JAX environment, on the chip)."""

    def __init__(self, setup: LearnerSetup, *, devices: Sequence | None = None,
                 abstract: bool = False) -> None:
        """Build the mesh, the agent and its state.

        Args:
            setup: what the learner learns, the same on every chip.
            devices: the mesh's devices, in mesh order; None: every device of the JAX
                process group (``jax.devices()``), as on the slice.
            abstract: build without running anything: the state (and a mode's envs) are
                ``jax.ShapeDtypeStruct`` leaves with their shardings, so ``devices`` may be
                compile-only ones (a TPU topology's, see :mod:`workbench.tpu.targets`).
                Only :meth:`programs` is of use then: such a learner cannot step.
        """
        import jax
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        self.setup = setup
        self.abstract = abstract
        self.mesh = Mesh(np.array(jax.devices() if devices is None else list(devices)),
                         (AXIS,))
        self.num_chips = self.mesh.size
        self._replicated = NamedSharding(self.mesh, P())
        self._per_chip = NamedSharding(self.mesh, P(AXIS))
        self.agent = setup.agent.build()
        # NOTE: an abstract learner keeps only the keys' shapes: every key is an argument of
        # the programs, so they lower the same without a value.
        self.keys = (jax.eval_shape(run_keys.run_keys, setup.seed) if abstract
                     else run_keys.run_keys(setup.seed))
        self._program_identity = program_identity(setup)
        self.chip_update = sync.chip_update(self.agent.update, setup.sync, AXIS)
        self.check_replication = sync.checks_replication(setup.sync)
        # Initialising an orthogonal network compiles for seconds: cached like the update,
        # and the key is an argument, so every seed shares one program.
        self._make_state = jax.jit(self.agent.init, out_shardings=self._replicated)
        key = self._replicate(self.keys.params)
        if abstract:
            self.state = self._shaped(jax.eval_shape(self.agent.init, key), self._replicated)
        else:
            self.state = load_or_compile(
                self._lowered("init", lambda: self._trace_init().lower()))(key)
        # Kept on the host too, so the per-update key needs no device read.
        self._updates = 0
        self._compiled = None

    # ---- the mode interface -------------------------------------------------------------

    def compile(self) -> float:
        """Compile the update ahead of the first step; returns the seconds it took.

        Raises:
            RuntimeError: an abstract learner (its programs compile through
                :meth:`programs` instead, for devices that need not be here).
        """
        if self.abstract:
            raise RuntimeError("an abstract learner runs nothing: lower its programs "
                               "through programs() (see workbench.learn.ahead).")
        started = time.perf_counter()
        if self._compiled is None:
            self._compiled = load_or_compile(self._lowered("update", self._lower))
        return time.perf_counter() - started

    def programs(self) -> dict[str, Callable[[], Any]]:
        """Every program this learner runs, by name, in the order it runs them, each as a
        function that traces it (a ``jax.stages.Traced``; ``.lower()`` lowers it) for this
        learner's mesh with the arguments a run gives it: ``init`` (the state), a mode's
        own set-up programs, then ``update``."""
        return {"init": self._trace_init, "update": self._trace_update}

    def _trace_init(self):
        return self._make_state.trace(self._replicate(self.keys.params))

    def _trace_update(self):
        raise NotImplementedError

    def _lower(self):
        """The update, lowered (what :meth:`compile` compiles)."""
        return self._trace_update().lower()

    def _lowered(self, what: str, lower: Callable[[], Any]):
        """``lower()``, or what it gave a learner of this process built from the same setup
        but for the seed (every key is an argument, so the programs are the same): a
        learner kept warm skips tracing its programs again."""
        if self._program_identity is None or self.abstract:
            return lower()
        key = (type(self).__qualname__, what, self.num_chips, self._program_identity)
        return kept_in_memory(_lowered_programs, key, lower, LOWERED_KEPT)

    def step(self, stop: bool = False, checkpoint: bool = False) -> StepOutcome:
        """One update; every chip of the slice must call it together. ``stop`` and
        ``checkpoint`` are this chip's requests; the outcome says what all chips agreed."""
        raise NotImplementedError

    def finish(self) -> None:
        """Called once after the last step (a mode may have work in flight)."""

    def resume_state(self) -> dict:
        """What besides the learner state makes a resume exact, as numpy pytrees by name.
        Every chip must call it together, after the same update (it may gather)."""
        return {}

    def load_resume_state(self, resume: dict[str, list]) -> bool:
        """Take back what :meth:`resume_state` gave (its leaves, by name); False if it does
        not fit this learner (another slice shape), which then starts its envs afresh."""
        return not resume

    # ---- state ------------------------------------------------------------------------

    @property
    def update_count(self) -> int:
        return self._updates

    def policy_numpy(self):
        """The acting part of the state (what rollouts and evaluations need), on the host."""
        return to_numpy(self.agent.policy(self.state))

    def state_leaves(self) -> list[np.ndarray]:
        """The whole learner state as an ordered list of numpy arrays."""
        import jax

        return jax.tree.leaves(to_numpy(self.state))

    def load_state_leaves(self, leaves: Sequence[np.ndarray], update: int) -> None:
        """Put what :meth:`state_leaves` returned back onto the mesh, at ``update``.

        Raises:
            ValueError: the leaves do not fit this learner's state.
        """
        import jax

        structure = jax.tree.structure(self.state)
        if structure.num_leaves != len(leaves):
            raise ValueError(
                f"the checkpoint holds {len(leaves)} arrays but this learner's state has "
                f"{structure.num_leaves}: was it written with another network or algorithm?"
            )
        restored = jax.tree.unflatten(structure, list(leaves))
        self.state = jax.tree.map(self._replicate, restored)
        self._updates = int(update)

    def digest(self) -> str:
        """SHA-256 of the whole state: equal on every chip after every update."""
        digest = hashlib.sha256()
        for leaf in self.state_leaves():
            digest.update(np.ascontiguousarray(leaf).tobytes())
        return digest.hexdigest()

    # ---- helpers for the modes --------------------------------------------------------

    @staticmethod
    def _shaped(tree, sharding):
        """``tree``'s leaves as shapes and dtypes placed with ``sharding`` (abstract)."""
        import jax

        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree
        )

    def _replicate(self, value):
        import jax

        if self.abstract:
            return self._shaped(value, self._replicated)
        return jax.make_array_from_process_local_data(self._replicated, np.asarray(value))

    def _update_key(self):
        """The same key on every chip for this update."""
        if self.abstract:
            import jax

            return self._replicate(jax.eval_shape(run_keys.update_key, self.keys, 0))
        return self._replicate(run_keys.update_key(self.keys, self._updates))

    def _requests(self, stop: bool, checkpoint: bool):
        """This chip's request flags, as the sync strategy takes them (one row per chip)."""
        import jax

        if self.abstract:
            return jax.ShapeDtypeStruct((self.num_chips, len(sync.REQUESTS)), np.int32,
                                        sharding=self._per_chip)
        return jax.make_array_from_process_local_data(
            self._per_chip, np.asarray([[int(stop), int(checkpoint)]], np.int32)
        )

    def _agreed(self, agreed) -> tuple[bool, bool]:
        stop, checkpoint = (bool(x) for x in to_numpy(agreed))
        return stop, checkpoint

    def _metrics(self, metrics) -> dict[str, float]:
        return {k: float(v) for k, v in to_numpy(metrics).items()}
