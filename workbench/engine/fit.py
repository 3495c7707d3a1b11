"""Whether a run fits a TPU slice, answered before any slice is reserved.

:func:`plan_fit` plans the run as training would (:func:`workbench.engine.plan.plan_run`:
the same validation, spaces and learner setup; no cluster), compiles its learner's programs
for the slice's compile-only TPU devices (:mod:`workbench.tpu.targets`, which needs the
``tpu`` extra), and reads from the compiler what each chip must hold and the work of one
update. That is what ``workbench plan`` prints and ``wb.plan`` returns.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from workbench.engine.config import TrainConfig
from workbench.tpu.catalog import SliceShape, parse_shape

COMPILE_THREADS = 2
"""Programs compiled at once: a learner has two or three, and the compiler lets go of
Python's lock while it works."""


@dataclass(frozen=True)
class ProgramFit:
    """One learner program on one chip, as the compiler sized it."""

    name: str
    """``init``, ``init_envs`` (Anakin) or ``update``."""
    bytes_per_chip: int
    """HBM the program needs of a chip while it runs (arguments, outputs, scratch and code,
    less the outputs written into donated arguments)."""
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    generated_code_bytes: int
    flops: float
    """One call's floating-point operations on one chip, every loop's trips counted (an
    estimate: XLA counts a loop's body once, see ``loop_repeats``)."""
    bytes_accessed: float
    """One call's HBM traffic on one chip, counted as ``flops`` is."""
    loop_repeats: float
    """The factor that turned XLA's once-per-loop counts into whole-call ones."""


@dataclass(frozen=True)
class FitReport:
    """Whether a run's learner fits each chip of a TPU slice, and what one update costs."""

    compiled_for: str
    """The slice's pod type, e.g. ``v6e-4`` (``v4-16`` for eight 2-core v4 chips)."""
    generation: str
    topology: str
    chips: int
    hosts: int
    mode: str
    algo: str
    env: str
    sync: str
    """The sync strategy the run uses on TPUs (``auto`` resolves to ``gradients``)."""
    fits: bool
    """Every program needs at most the chip's HBM."""
    hbm_bytes_per_chip: int
    """The most any one program needs of a chip (the programs run one after another, and
    each holds the learner's state among its arguments)."""
    hbm_capacity_bytes: int
    """A chip's HBM (the catalog's ``hbm_gib_per_chip``)."""
    flops_per_update: float
    """Floating-point operations of one update on one chip."""
    bytes_per_update: float
    """HBM bytes one update reads and writes on one chip."""
    estimated_update_s: float
    """The roofline lower bound of one update on one chip: the larger of its FLOPs over
    the chip's peak bf16 FLOP/s and its bytes over the chip's HBM bandwidth. Collectives,
    host transfers and f32 matmuls (slower than bf16 on a TPU) come on top."""
    programs: tuple[ProgramFit, ...]
    """Each compiled program, in the order the learner runs them."""
    refused: str = ""
    """The compiler's own words when it refused a program for want of memory (then
    ``fits`` is False and the byte counts are what it reported, or 0)."""

    @property
    def update(self) -> ProgramFit | None:
        return next((p for p in self.programs if p.name == "update"), None)

    def to_json(self) -> dict[str, Any]:
        """The report as plain JSON-ready values."""
        record = dataclasses.asdict(self)
        record["programs"] = [dataclasses.asdict(p) for p in self.programs]
        return record

    def shortfall(self) -> str:
        """One line saying what is needed and what there is (for a refusal)."""
        needed = (f"{_gib(self.hbm_bytes_per_chip)} per chip" if self.hbm_bytes_per_chip
                  else "more than there is")
        why = f" (the compiler: {self.refused.rstrip('.')})" if self.refused else ""
        return (f"{self.algo} on {self.env} in {self.mode} mode does not fit a "
                f"{self.generation} {self.topology} slice ({self.compiled_for}): its learner "
                f"needs {needed} ({self.hbm_bytes_per_chip} bytes) and a chip has "
                f"{_gib(self.hbm_capacity_bytes)} ({self.hbm_capacity_bytes} bytes) of "
                f"HBM{why}. Use fewer envs_per_chip or a shorter rollout_length, a smaller "
                "network, or a generation with more HBM per chip.")

    def summary(self) -> str:
        """A few lines for people."""
        head = (f"{self.algo} on {self.env} ({self.mode} mode, sync {self.sync}) compiled for "
                f"{self.compiled_for} ({self.generation} {self.topology}: {self.chips} chips "
                f"on {self.hosts} host(s)).")
        if not self.fits:
            return f"{head}\nDOES NOT FIT: {self.shortfall()}"
        share = self.hbm_bytes_per_chip / self.hbm_capacity_bytes
        lines = [head,
                 f"Fits: {_gib(self.hbm_bytes_per_chip)} of {_gib(self.hbm_capacity_bytes)} "
                 f"HBM per chip ({share:.2%}).",
                 f"One update per chip: {self.flops_per_update:.3g} FLOPs, "
                 f"{self.bytes_per_update:.3g} bytes of HBM traffic; at least "
                 f"{self.estimated_update_s * 1e3:.3g} ms (roofline)."]
        for p in self.programs:
            lines.append(f"  {p.name:<10} {_gib(p.bytes_per_chip):>12} per chip "
                         f"(arguments {p.argument_bytes}, outputs {p.output_bytes}, scratch "
                         f"{p.temp_bytes}, donated {p.alias_bytes}, code "
                         f"{p.generated_code_bytes} bytes)")
        return "\n".join(lines)


def _gib(count: int) -> str:
    return f"{count / 2**30:.3f} GiB" if count >= 2**24 else f"{count / 2**20:.2f} MiB"


def roofline_seconds(flops: float, bytes_accessed: float, peak_flops_per_s: float,
                     bytes_per_s: float) -> float:
    """The least time a chip takes for ``flops`` and ``bytes_accessed``: whichever of its
    compute and its memory bandwidth binds.

    Args:
        flops: floating-point operations.
        bytes_accessed: bytes read and written in HBM.
        peak_flops_per_s: the chip's peak FLOP/s.
        bytes_per_s: the chip's HBM bandwidth.

    Returns:
        Seconds, at least 0.

    Raises:
        ValueError: a rate that is not positive.
    """
    if peak_flops_per_s <= 0 or bytes_per_s <= 0:
        raise ValueError("peak FLOP/s and HBM bandwidth must be positive.")
    return max(0.0, flops / peak_flops_per_s, bytes_accessed / bytes_per_s)


def fit_report(shape: SliceShape, config: TrainConfig, sync: str, footprints: dict,
               per_chip: int = 1, refused: str = "") -> FitReport:
    """The report of compiled ``footprints`` (:func:`workbench.learn.ahead.compile_programs`,
    per device) for ``shape``; pure.

    Args:
        shape: the slice compiled for.
        config: the run.
        sync: the sync strategy compiled with.
        footprints: the programs' footprints by name, each per device.
        per_chip: devices per chip (2 on v7x).
        refused: the compiler's message when it refused a program for want of memory.
    """
    gen = shape.generation
    programs = tuple(
        ProgramFit(f.name, f.total_bytes * per_chip, f.argument_bytes * per_chip,
                   f.output_bytes * per_chip, f.temp_bytes * per_chip,
                   f.alias_bytes * per_chip, f.generated_code_bytes * per_chip,
                   f.flops_per_call * per_chip, f.bytes_per_call * per_chip, f.loop_repeats)
        for f in footprints.values())
    capacity = int(gen.hbm_gib_per_chip * 2**30)
    needed = max((p.bytes_per_chip for p in programs), default=0)
    update = next((p for p in programs if p.name == "update"), None)
    flops = update.flops if update else 0.0
    traffic = update.bytes_accessed if update else 0.0
    return FitReport(
        compiled_for=shape.pod_type, generation=gen.name, topology=shape.topology,
        chips=shape.chips, hosts=shape.hosts, mode=config.mode, algo=config.algo,
        env=config.env, sync=sync, fits=not refused and needed <= capacity,
        hbm_bytes_per_chip=needed, hbm_capacity_bytes=capacity, flops_per_update=flops,
        bytes_per_update=traffic,
        estimated_update_s=roofline_seconds(flops, traffic,
                                            gen.peak_bf16_tflops_per_chip * 1e12,
                                            gen.hbm_gbps_per_chip * 1e9),
        programs=programs, refused=refused,
    )


def plan_fit(shape: SliceShape | tuple[str, str], config: TrainConfig, *,
             layout: str = "chip") -> FitReport:
    """Plan ``config`` for a TPU slice of ``shape`` and compile its learner's programs for
    that slice's chips, without reserving anything: does it fit, and what does an update
    cost?

    Args:
        shape: the slice: a :class:`~workbench.tpu.catalog.SliceShape` or a
            ``(generation, topology)`` pair such as ``("v6e", "2x2")``.
        config: the run, as :func:`workbench.engine.train` would take it.
        layout: how the slice's chips split into JAX processes (``host`` or ``chip``): the
            compiled programs are the same either way.

    Returns:
        The :class:`FitReport`; a run that does not fit has ``fits`` False (and
        :meth:`FitReport.shortfall` says by how much).

    Raises:
        workbench.tpu.targets.TpuCompilerMissingError: libtpu is not installed (the
            ``tpu`` extra), an ``ImportError``.
        ValueError: a config that cannot work (as training would refuse it), an unknown
            shape, or a shape libtpu cannot describe.
    """
    from workbench.engine.plan import plan_run
    from workbench.learn import sync as sync_strategies
    from workbench.learn.ahead import ProgramTooLargeError, compile_programs
    from workbench.tpu.targets import devices_per_chip, target_devices

    if not isinstance(shape, SliceShape):
        shape = parse_shape(*shape)
    plan = plan_run(config)
    target = target_devices(shape, layout)  # type: ignore[arg-type]
    sync = sync_strategies.resolve(config.sync, "tpu")
    setup = plan.learner_setup(shape.chips, sync)
    per_chip = devices_per_chip(shape)
    try:
        footprints = compile_programs(setup, config.mode, target.devices,
                                      threads=COMPILE_THREADS)
    except ProgramTooLargeError as refusal:
        report = fit_report(shape, config, sync, {}, per_chip, str(refusal))
        return dataclasses.replace(report, hbm_bytes_per_chip=refusal.bytes_needed * per_chip)
    return fit_report(shape, config, sync, footprints, per_chip)


def _plan_fit_on_cpu(shape: SliceShape, config: TrainConfig, layout: str) -> FitReport:
    """:func:`plan_fit` in a process of its own, pinned to JAX's CPU platform first."""
    import jax

    jax.config.update("jax_platforms", "cpu")
    return plan_fit(shape, config, layout=layout)


def plan_fit_isolated(shape: SliceShape | tuple[str, str], config: TrainConfig, *,
                      layout: str = "chip") -> FitReport:
    """:func:`plan_fit` in a fresh CPU-only process, which ends with the answer.

    For a driver about to train: its own JAX stays as it was (no backend started, nothing
    compiled kept in memory), and on a TPU host libtpu's lock, which the learners there
    need, is never taken by the driver.

    Raises:
        As :func:`plan_fit`; a child that dies raises ``RuntimeError``.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from workbench.tpu.targets import TpuCompilerMissingError, libtpu_installed

    if not isinstance(shape, SliceShape):
        shape = parse_shape(*shape)
    if not libtpu_installed():  # said here, without a process started for it
        raise TpuCompilerMissingError(f"Checking that the run fits {shape.label}")
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
        try:
            return child.submit(_plan_fit_on_cpu, shape, config, layout).result()
        except BrokenProcessPool:
            raise RuntimeError(f"the process compiling the run for {shape.label} died; run "
                               "`workbench plan` with the same flags to see why.") from None


__all__ = ["FitReport", "ProgramFit", "fit_report", "plan_fit", "plan_fit_isolated",
           "roofline_seconds"]
