"""A learner's programs compiled ahead of time for a list of devices, and what each needs.

The learner is built over the devices without running anything (``abstract=True``, see
:class:`~workbench.learn.learner.ChipLearner`): the same code and the same programs as on
the slice, lowered with shapes and shardings in place of values. With the compile-only
devices of a TPU topology (:func:`workbench.tpu.targets.target_devices`) this compiles what
a TPU slice would run, on a machine without one, and reads from the compiler the memory
each device needs and the work of one call.

Whether one process holds one chip (the ``chip`` layout) or one process holds a host's
chips (the ``host`` layout), the compiled SPMD program over N devices is the same: each
device runs its partition of it. Only how the processes feed their local data into the
global arrays differs, and that happens outside the program.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workbench.learn.compile_cache import kept_in_memory
from workbench.learn.learner import LearnerSetup
from workbench.learn.modes import learner_class


@dataclass(frozen=True)
class ProgramFootprint:
    """What one compiled program needs of each device it runs on (a chip, or one of a
    v7x chip's two devices), and what one call of it does there, as the compiler says."""

    name: str
    """The learner's name for the program: ``init``, ``init_envs`` (Anakin) or ``update``."""
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    """Scratch the program allocates while it runs."""
    alias_bytes: int
    """Outputs written into donated arguments' buffers (counted once, as arguments)."""
    generated_code_bytes: int
    total_bytes: int
    """What the device must hold at once: see :func:`bytes_needed`."""
    flops: float
    """Floating-point operations of one call on one device, as XLA's cost analysis counts
    them: the body of a loop once, whatever its trip count."""
    bytes_accessed: float
    """Bytes one call reads and writes in the device's memory, counted as ``flops`` is."""
    loop_repeats: float = 1.0
    """How many times over the program's work is done when every loop runs all its trips
    rather than once (:func:`loop_repeats`): multiply ``flops`` and ``bytes_accessed`` by
    it for an estimate of one whole call."""

    @property
    def flops_per_call(self) -> float:
        """``flops`` with every loop's trips counted (an estimate; see ``loop_repeats``)."""
        return self.flops * self.loop_repeats

    @property
    def bytes_per_call(self) -> float:
        """``bytes_accessed`` with every loop's trips counted (an estimate)."""
        return self.bytes_accessed * self.loop_repeats


def bytes_needed(argument: int, output: int, temp: int, alias: int, code: int) -> int:
    """The device memory a program needs while it runs: its arguments, outputs, scratch and
    code, less the outputs that reuse donated arguments' buffers.

    Args:
        argument: bytes of the arguments.
        output: bytes of the outputs.
        temp: bytes of scratch.
        alias: bytes of outputs aliased to (donated) arguments.
        code: bytes of the program's generated code.

    Returns:
        The bytes, at least 0.
    """
    return max(0, argument + output + temp + code - alias)


def _work(jaxpr) -> tuple[float, float]:
    """Element operations of ``jaxpr`` (a dot counts its multiply-adds), as ``(every trip
    of every scan counted, each scan's body counted once)``."""
    from jax.extend.core import ClosedJaxpr, Jaxpr

    full = once = 0.0
    for eqn in jaxpr.eqns:
        inner = [j.jaxpr if isinstance(j, ClosedJaxpr) else j
                 for value in eqn.params.values()
                 for j in (value if isinstance(value, (tuple, list)) else (value,))
                 if isinstance(j, (ClosedJaxpr, Jaxpr))]
        if not inner:
            here = _leaf_work(eqn)
            full, once = full + here, once + here
            continue
        works = [_work(j) for j in inner]
        if eqn.primitive.name == "cond":  # one branch runs: the costliest bounds it
            full += max(w[0] for w in works)
            once += max(w[1] for w in works)
            continue
        # NOTE: a while loop's trips are not known here; like XLA, count its body once.
        trips = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
        full += trips * sum(w[0] for w in works)
        once += sum(w[1] for w in works)
    return full, once


def _leaf_work(eqn) -> float:
    import math

    def size(var) -> int:
        shape = getattr(getattr(var, "aval", None), "shape", None)
        return math.prod(shape) if shape is not None else 0

    out = sum(size(v) for v in eqn.outvars)
    if eqn.primitive.name == "dot_general":
        (contracting, _), _ = eqn.params["dimension_numbers"]
        lhs = eqn.invars[0].aval.shape
        return 2.0 * out * math.prod(lhs[d] for d in contracting)
    return float(max(out, sum(size(v) for v in eqn.invars) if "reduce" in eqn.primitive.name
                     else 0))


def loop_repeats(closed_jaxpr) -> float:
    """How many times over a program does its work when every ``scan`` runs all its trips,
    relative to counting each loop's body once, as XLA's cost analysis does.

    A rough count from the program's jaxpr (element operations, a dot's multiply-adds),
    used only as this ratio; while loops, whose trips are not known before they run,
    count once in both.

    Args:
        closed_jaxpr: the traced program's jaxpr (``jax.stages.Traced.jaxpr``).

    Returns:
        The ratio, at least 1.
    """
    full, once = _work(closed_jaxpr.jaxpr)
    return max(1.0, full / once) if once > 0 else 1.0


def footprint(name: str, compiled, repeats: float = 1.0) -> ProgramFootprint:
    """The footprint of a compiled program (a ``jax.stages.Compiled``).

    Args:
        name: the program's name.
        compiled: the compiled program.
        repeats: its :func:`loop_repeats`.

    Raises:
        ValueError: the backend gives no memory analysis.
    """
    memory = compiled.memory_analysis()
    if memory is None:
        raise ValueError(f"the compiler gives no memory analysis for {name!r} on this backend.")
    costs = compiled.cost_analysis()
    # Older JAX returned one dict per partition in a list; each is the same program.
    if isinstance(costs, (list, tuple)):
        costs = costs[0] if costs else {}
    costs = costs or {}
    sizes = (int(memory.argument_size_in_bytes), int(memory.output_size_in_bytes),
             int(memory.temp_size_in_bytes), int(memory.alias_size_in_bytes),
             int(memory.generated_code_size_in_bytes))
    return ProgramFootprint(name, *sizes, bytes_needed(*sizes),
                            float(costs.get("flops", 0.0)),
                            float(costs.get("bytes accessed", 0.0)), float(repeats))


class ProgramTooLargeError(ValueError):
    """The compiler refused a program: the devices' memory cannot hold it."""

    def __init__(self, program: str, message: str, bytes_needed: int) -> None:
        super().__init__(f"{program}: {message}")
        self.program = program
        self.message = message
        """The compiler's own words."""
        self.bytes_needed = bytes_needed
        """What the compiler says the program needs of a device, in bytes; 0 when it does
        not say."""


def out_of_memory(error: BaseException) -> str | None:
    """The compiler's message when ``error`` is its refusal of a program that a device's
    memory cannot hold (``RESOURCE_EXHAUSTED``), on one line; else None."""
    text = " ".join(str(error).split())
    if "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text:
        return text[:500]
    return None


_SCALE = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def bytes_in_refusal(message: str) -> int:
    """What an out-of-memory refusal says the program needs, in bytes: the first size
    after ``required`` (libtpu: "the total memory required for HLO temporaries (48.01G)
    exceeds available HBM (31.25G)") or ``Used`` ("Used 40.1G of 31.25G hbm"); 0 if none.
    """
    import re

    found = re.search(r"(?:required|Used)\D*?([0-9]+(?:\.[0-9]+)?)([KMGT])", message)
    return int(float(found.group(1)) * _SCALE[found.group(2)]) if found else 0


KEPT = 256
"""Footprints a process keeps, by program text and devices: one algorithm's init program is
the same in both modes, and a plan asked twice compiles nothing again."""
_footprints: OrderedDict = OrderedDict()


def _digest(lowered) -> str:
    """A lowered program's identity: its text (shapes, shardings, donations) and the
    structure of its arguments."""
    import hashlib

    digest = hashlib.sha256(lowered.as_text().encode())
    digest.update(str(lowered.in_tree).encode())
    return digest.hexdigest()


def _device_identity(devices: Sequence) -> tuple:
    """What besides a program's text decides what it compiles to on ``devices``."""
    first = devices[0]
    return (first.platform, first.device_kind, len(devices),
            tuple((d.id, d.process_index, tuple(getattr(d, "coords", ()))) for d in devices))


def compile_programs(setup: LearnerSetup, mode: str, devices: Sequence, *,
                     threads: int = 1) -> dict[str, ProgramFootprint]:
    """Lower and compile every program of ``mode``'s learner for ``devices``.

    Nothing runs: the learner is built abstract over the devices, which may be
    compile-only ones (a TPU topology's on a machine without TPUs).

    Args:
        setup: the learner's setup (:meth:`workbench.engine.plan.RunPlan.learner_setup`),
            with the sync strategy the target resolves to.
        mode: ``actors`` or ``anakin``.
        devices: the mesh's devices, in mesh order.
        threads: programs compiled at once (the compiler leaves Python's lock while it
            works).

    Returns:
        Each program's footprint by its name, in the order the learner runs them.

    Raises:
        ProgramTooLargeError: the compiler refused a program that the devices' memory
            cannot hold (a ``ValueError``).
        ValueError: an unknown mode, or no devices.
    """
    return compile_many([(setup, mode, devices)], threads=threads)[0]


def compile_many(builds: Sequence[tuple[LearnerSetup, str, Sequence]], *,
                 threads: int = 1) -> list[dict[str, ProgramFootprint]]:
    """:func:`compile_programs` for each ``(setup, mode, devices)`` of ``builds``: every
    learner traced and lowered here in turn, and each distinct program compiled once, on
    up to ``threads`` threads beside this one.

    Raises:
        ProgramTooLargeError: the compiler refused a program that the devices' memory
            cannot hold.
        ValueError: an unknown mode, or a build without devices.
    """
    from concurrent.futures import ThreadPoolExecutor

    def build(name: str, lowered, repeats: float) -> ProgramFootprint:
        try:
            compiled = lowered.compile()
        except Exception as error:  # the compiler's errors have no class of their own
            refused = out_of_memory(error)
            if refused is None:
                raise
            raise ProgramTooLargeError(name, refused, bytes_in_refusal(refused)) from None
        return footprint(name, compiled, repeats)

    keyed: list[dict[str, tuple]] = []
    pending: dict[tuple, Any] = {}
    # NOTE: each program is handed to the compiler as soon as it is lowered, so the
    # compiles (which let go of Python's lock) overlap the tracing of the next learners.
    with ThreadPoolExecutor(max(1, threads)) as pool:
        for setup, mode, devices in builds:
            if not devices:
                raise ValueError("compile_programs needs at least one device.")
            devices = list(devices)
            learner = learner_class(mode)(setup, None, devices=devices, abstract=True)
            where = _device_identity(devices)
            programs = {}
            for name, trace in learner.programs().items():
                traced = trace()
                lowered = traced.lower()
                key = (name, _digest(lowered), where)
                programs[name] = key
                if key not in _footprints and key not in pending:
                    pending[key] = pool.submit(build, name, lowered,
                                               loop_repeats(traced.jaxpr))
            keyed.append(programs)
        made = {key: future.result() for key, future in pending.items()}
    found = [{name: made[key] if key in made else _footprints[key]
              for name, key in programs.items()} for programs in keyed]
    for key, value in made.items():
        kept_in_memory(_footprints, key, lambda v=value: v, KEPT)
    return found


__all__ = ["ProgramFootprint", "ProgramTooLargeError", "bytes_in_refusal", "bytes_needed",
           "compile_many", "compile_programs", "footprint", "loop_repeats", "out_of_memory"]
