"""Every learner program compiled for real TPU targets, on this machine without a TPU.

libtpu (the ``tpu`` extra) describes any slice's devices without a chip; the learners are
built over them abstract (nothing runs) through the same code that trains on the slice,
and every program of every registered algorithm in both modes is compiled for a single-host
and a multi-host shape of v4, v5e, v5p and v6e. Each program's memory per chip must be
more than nothing and less than the chip's HBM, and its cost analysis is kept.

The compiles are shared: one fixture traces every learner in turn and compiles each
distinct program once, two at a time (an algorithm's init program is the same in both
modes).
"""

from __future__ import annotations

import pytest

from workbench.tpu import targets

if not targets.libtpu_installed():
    pytest.skip(f"libtpu is not installed, so nothing can be compiled for a TPU here: "
                f"{targets.EXTRA}", allow_module_level=True)

from workbench.algos.impala.config import IMPALAConfig  # noqa: E402
from workbench.algos.ppo import PPOConfig  # noqa: E402
from workbench.algos.pqn.config import PQNConfig  # noqa: E402
from workbench.engine.config import TrainConfig  # noqa: E402
from workbench.tpu.catalog import parse_shape  # noqa: E402

SHAPES = (("v4", "2x2x1"), ("v4", "2x2x2"), ("v5e", "2x2"), ("v5e", "4x4"),
          ("v5p", "2x2x1"), ("v5p", "2x2x2"), ("v6e", "2x2"), ("v6e", "4x4"))
"""A single-host and a multi-host shape of each generation."""
# Small networks and batches: what is checked is that every program compiles for the
# target and what it needs, not a realistic size (the CLI tests plan the defaults).
# One hidden layer halves the init programs' compiles (an orthogonal initialisation is a
# QR decomposition per layer); the loops over epochs and minibatches stay loops.
SMALL = {"ppo": PPOConfig(hidden_sizes=(16,), num_minibatches=2, num_epochs=2),
         "impala": IMPALAConfig(hidden_sizes=(16,), num_minibatches=2),
         "pqn": PQNConfig(hidden_sizes=(16,), num_minibatches=2, num_epochs=2)}
ALGORITHMS = {
    # name: (algorithm, gymnasium env for actors mode, JAX env for Anakin mode)
    "ppo-discrete": ("ppo", "CartPole-v1", "workbench/CartPole-v1"),
    "ppo-continuous": ("ppo", "Pendulum-v1", "gymnax:Pendulum-v1"),
    "impala": ("impala", "CartPole-v1", "workbench/CartPole-v1"),
    "pqn": ("pqn", "CartPole-v1", "workbench/CartPole-v1"),
}
MODES = ("actors", "anakin")
CASES = [(algo, mode, gen, topo) for algo in ALGORITHMS for mode in MODES
         for gen, topo in SHAPES]


def _config(name: str, mode: str, run_dir: str) -> TrainConfig:
    algo, gym_env, jax_env = ALGORITHMS[name]
    return TrainConfig(env=gym_env if mode == "actors" else jax_env, mode=mode, algo=algo,
                       algo_config=SMALL[algo], envs_per_chip=4, rollout_length=8,
                       total_env_steps=10_000, run_dir=run_dir)


@pytest.fixture(scope="module")
def compile_only_jax():
    """This process compiles only: JAX on the CPU, so libtpu is loaded as a compiler
    beside any other process that holds its lock (put back afterwards)."""
    import jax

    before = jax.config.jax_platforms
    jax.config.update("jax_platforms", "cpu")
    yield
    jax.config.update("jax_platforms", before)


@pytest.fixture(scope="module")
def compiled(compile_only_jax, tmp_path_factory):
    """Every case's programs' footprints, by case: all compiled in one go."""
    from workbench.engine.plan import plan_run
    from workbench.learn import sync
    from workbench.learn.ahead import compile_many

    run_dir = str(tmp_path_factory.mktemp("runs") / "run")
    devices = {shape: targets.target_devices(parse_shape(*shape)) for shape in SHAPES}
    plans = {(name, mode): plan_run(_config(name, mode, run_dir))
             for name in ALGORITHMS for mode in MODES}
    builds = []
    for name, mode, gen, topo in CASES:
        target = devices[(gen, topo)]
        plan = plans[(name, mode)]
        setup = plan.learner_setup(target.shape.chips, sync.resolve(plan.config.sync, "tpu"))
        builds.append((setup, mode, target.devices))
    return dict(zip(CASES, compile_many(builds, threads=2), strict=True))


@pytest.mark.parametrize(("name", "mode", "generation", "topology"), CASES)
def test_every_learner_program_compiles_for_the_tpu_and_fits_its_chip(
        compiled, name, mode, generation, topology):
    shape = parse_shape(generation, topology)
    capacity = int(shape.generation.hbm_gib_per_chip * 2**30)
    programs = compiled[(name, mode, generation, topology)]
    expected = ["init", "init_envs", "update"] if mode == "anakin" else ["init", "update"]
    assert list(programs) == expected
    for program in programs.values():
        assert 0 < program.total_bytes < capacity, program
        assert program.total_bytes == (program.argument_bytes + program.output_bytes
                                       + program.temp_bytes + program.generated_code_bytes
                                       - program.alias_bytes)
        assert program.flops > 0 and program.bytes_accessed > 0, program
        assert program.loop_repeats >= 1
    update = programs["update"]
    # The update takes the state in and gives it back in the same (donated) buffers.
    assert update.alias_bytes > 0
    if name.startswith("ppo"):
        # Epochs times minibatches of the same step: XLA counts the loop's body once.
        assert update.loop_repeats > 2
        assert update.flops_per_call > update.flops


def test_a_bigger_slice_holds_the_same_state_per_chip(compiled):
    """The state is replicated: each chip of a 4x4 holds what each chip of a 2x2 does."""
    small = compiled[("ppo-discrete", "actors", "v6e", "2x2")]["init"]
    large = compiled[("ppo-discrete", "actors", "v6e", "4x4")]["init"]
    assert small.output_bytes == large.output_bytes


def test_one_process_per_chip_or_per_host_is_the_same_program(compile_only_jax, tmp_path):
    """The ``chip`` layout (a JAX process per chip) and the ``host`` layout (one per host,
    holding its chips) compile to the same SPMD program over the same devices: only how
    processes feed their local data into the global arrays differs, outside the program."""
    from workbench.engine.plan import plan_run
    from workbench.learn.ahead import compile_programs
    from workbench.learn.modes import learner_class

    shape = parse_shape("v6e", "4x4")
    per_chip = targets.target_devices(shape, "chip")
    per_host = targets.target_devices(shape, "host")
    assert (per_chip.processes, per_host.processes) == (16, 4)
    setup = plan_run(_config("ppo-discrete", "actors", str(tmp_path))).learner_setup(
        shape.chips, "gradients")
    texts = []
    for target in (per_chip, per_host):
        learner = learner_class("actors")(setup, None, devices=target.devices, abstract=True)
        texts.append({name: trace().lower().as_text()
                      for name, trace in learner.programs().items()})
    assert texts[0] == texts[1]
    chip_layout = compile_programs(setup, "actors", per_chip.devices)
    host_layout = compile_programs(setup, "actors", per_host.devices)
    assert chip_layout == host_layout


def test_an_enormous_network_is_reported_as_not_fitting(compile_only_jax, tmp_path):
    from workbench.engine.fit import plan_fit

    # Two 65536-wide layers: a 16 GiB weight matrix, and Adam's two moments beside it.
    config = TrainConfig(algo="pqn", algo_config=PQNConfig(hidden_sizes=(65536, 65536)),
                         envs_per_chip=4, rollout_length=8, run_dir=str(tmp_path / "run"))
    report = plan_fit(("v6e", "2x2"), config)
    assert not report.fits
    assert report.hbm_bytes_per_chip > report.hbm_capacity_bytes == 32 * 2**30
    assert "RESOURCE_EXHAUSTED" in report.refused or "memory" in report.refused
    assert "does not fit" in report.shortfall()


def test_v7x_compiles_with_two_devices_per_chip(compile_only_jax, tmp_path):
    from workbench.engine.fit import plan_fit

    shape = parse_shape("v7x", "2x2x1")
    target = targets.target_devices(shape)
    assert len(target.devices) == 8 and target.devices_per_chip == 2
    report = plan_fit(shape, _config("ppo-discrete", "actors", str(tmp_path / "run")))
    assert report.fits and report.compiled_for == "v7x-8"
    assert 0 < report.hbm_bytes_per_chip < report.hbm_capacity_bytes


@pytest.mark.parametrize(("generation", "topology", "name", "processes"), [
    ("v4", "2x2x1", "v4:2x2x1", 1), ("v4", "2x2x2", "v4:2x2x2", 2),
    ("v5e", "1x1", "v5e:1x1", 1), ("v5e", "2x2", "v5e:2x2", 1),
    # The v5e-8 board lies 4x2 although GKE labels it 2x4; the v6e-8 board is 2x4.
    ("v5e", "2x4", "v5e:4x2", 1), ("v6e", "2x4", "v6e:2x4", 1),
    ("v5e", "4x4", "v5e:4x4", 4), ("v5p", "2x2x1", "v5p:2x2x1", 1),
    ("v5p", "2x2x2", "v5p:2x2x2", 2), ("v6e", "1x1", "v6e:1x1", 1),
    ("v6e", "2x2", "v6e:2x2", 1), ("v6e", "4x4", "v6e:4x4", 4),
    ("v6e", "8x8", "v6e:8x8", 16), ("v7x", "2x2x2", "tpu7x:2x2x2", 2),
])
def test_libtpu_describes_each_catalog_shape_as_the_catalog_counts_it(
        compile_only_jax, generation, topology, name, processes):
    shape = parse_shape(generation, topology)
    assert targets.topology_name(shape) == name
    target = targets.target_devices(shape)
    assert target.topology_name == name
    assert len(target.devices) == shape.chips * target.devices_per_chip
    assert target.processes == processes == shape.hosts
    assert {d.platform for d in target.devices} == {"tpu"}
