"""The processes of a jax.distributed group on CPU (the simulated slice) compile a program
once between them, and load it in later runs.

The group here is two real processes joined by ``jax.distributed`` with gloo collectives,
as the learners of a simulated slice are, started twice on one cache directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from workbench.learn import compile_cache
from workbench.learn.compile_cache import program_key
from workbench.tpu.ports import free_port


def _group_step(rank: int, port: int, directory: str) -> None:
    """One process of the group: a program with a cross-process sum and a donated
    argument, built through the cache; prints what it computed."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from workbench.learn.compile_cache import load_or_compile
    from workbench.learn.platform import configure_jax_platform

    configure_jax_platform("cpu")
    compiles = []
    compile_program = jax.stages.Lowered.compile

    def counted(self, *args, **kwargs):
        compiles.append(1)
        return compile_program(self, *args, **kwargs)

    jax.stages.Lowered.compile = counted
    jax.config.update("jax_compilation_cache_dir", str(Path(directory) / "jax"))
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=rank,
                               coordinator_bind_address=f"127.0.0.1:{port}")
    mesh = Mesh(np.array(jax.devices()), ("chips",))

    def body(state, x):
        for _ in range(8):
            x = jax.numpy.tanh(x @ x.T) + state
        return state + jax.lax.psum(x.sum(), "chips"), x

    step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P("chips")),
                                 out_specs=(P(), P("chips"))), donate_argnums=(0,))
    state = jax.make_array_from_process_local_data(NamedSharding(mesh, P()),
                                                   np.float32(0.5))
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("chips")),
                                               np.full((16, 16), rank + 1.0, np.float32))
    compiled = load_or_compile(step.lower(state, x), str(Path(directory) / "programs"))
    for _ in range(3):
        state, x = compiled(state, x)
    print(json.dumps({"rank": rank, "state": float(np.asarray(state.addressable_data(0))),
                      "compiles": len(compiles)}))


def _run_group(directory: Path, env: dict[str, str] | None = None) -> list[dict]:
    port = free_port("127.0.0.1")
    environment = {**os.environ, **(env or {})}
    processes = [
        subprocess.Popen([sys.executable, __file__, str(rank), str(port), str(directory)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=environment)
        for rank in range(2)
    ]
    states = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err[-3000:]
        states.append(json.loads(out.strip().splitlines()[-1]))
    return states


def test_rank_0_compiles_for_the_group_and_later_runs_load_it(tmp_path):
    first = _run_group(tmp_path)
    # One binary for both ranks: rank 1 waited for rank 0's instead of compiling its own.
    assert [r["compiles"] for r in first] == [1, 0], first
    saved = sorted((tmp_path / "programs").iterdir())
    assert [p.name.split("-")[0:3] for p in saved] == [["all", "of", "2"]]
    written = saved[0].stat().st_mtime_ns

    second = _run_group(tmp_path)
    assert [r["compiles"] for r in second] == [0, 0], second
    assert saved[0].stat().st_mtime_ns == written, "the program was compiled again"
    states = [[r["state"] for r in run] for run in (first, second)]
    assert states[0] == states[1] and states[0][0] == states[0][1]


def test_a_damaged_program_file_is_compiled_again(tmp_path):
    first = _run_group(tmp_path)
    (saved,) = (tmp_path / "programs").iterdir()
    saved.write_bytes(b"not a program")
    again = _run_group(tmp_path)
    assert [r["state"] for r in again] == [r["state"] for r in first]
    assert again[0]["compiles"] == 1, again
    assert saved.stat().st_size > 1000, "the damaged file was not replaced"


def test_forced_per_rank_binaries_are_what_a_tpu_slice_keeps(tmp_path):
    """With the per-rank switch the simulated group takes a real slice's path: rank 0
    relies on JAX's cache, rank 1 compiles its own binary once and loads it later."""
    per_rank = {compile_cache.PER_RANK_ENV: "1"}
    first = _run_group(tmp_path, per_rank)
    assert [r["compiles"] for r in first] == [1, 1], first
    saved = sorted((tmp_path / "programs").iterdir())
    assert [p.name.split("-")[0:3] for p in saved] == [["p1", "of", "2"]]
    written = saved[0].stat().st_mtime_ns

    second = _run_group(tmp_path, per_rank)
    # Rank 0 asks the compiler again (JAX's own cache answers it); rank 1 loads its file.
    assert [r["compiles"] for r in second] == [1, 0], second
    assert saved[0].stat().st_mtime_ns == written, "rank 1's program was compiled again"
    states = [[r["state"] for r in run] for run in (first, second)]
    assert states[0] == states[1] and states[0][0] == states[0][1]


def _runtime_key(monkeypatch, platform_version: str, libtpu_args: str | None) -> str:
    monkeypatch.setattr(compile_cache, "_platform_version", lambda platform: platform_version)
    if libtpu_args is None:
        monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
    else:
        monkeypatch.setenv("LIBTPU_INIT_ARGS", libtpu_args)
    return program_key("module @jit_step {}", 1, 4, compile_cache._runtime_description())


def test_the_key_follows_libtpus_version_and_flags(monkeypatch):
    """A new libtpu, or other LIBTPU_INIT_ARGS, can emit another binary from the same
    program: neither may load a binary the other compiled."""
    version = "PJRT C API\nTFRT TPU v5 lite\nBuilt on Jan 1 2026 (cl/1)"
    key = _runtime_key(monkeypatch, version, None)
    assert key == _runtime_key(monkeypatch, version, None)
    assert key == _runtime_key(monkeypatch, version, "")
    others = {
        _runtime_key(monkeypatch, version.replace("cl/1", "cl/2"), None),
        _runtime_key(monkeypatch, version, "--xla_tpu_enable_latency_hiding_scheduler=true"),
        _runtime_key(monkeypatch, version, "--xla_tpu_enable_latency_hiding_scheduler=false"),
    }
    assert key not in others and len(others) == 3


def test_the_platform_version_is_read_from_the_backend():
    import jax

    device = jax.local_devices()[0]
    assert compile_cache._platform_version(device.platform) == device.client.platform_version


def test_the_key_tells_programs_ranks_and_runtimes_apart():
    key = program_key("module @jit_step {}", 1, 4, "jax 0.10.2|cpu")
    assert key.startswith("p1-of-4-") and key.endswith(".bin")
    assert program_key("module @jit_step {}", None, 4, "jax 0.10.2|cpu").startswith("all-of-4-")
    assert key == program_key("module @jit_step {}", 1, 4, "jax 0.10.2|cpu")
    others = {
        program_key("module @jit_step { }", 1, 4, "jax 0.10.2|cpu"),
        program_key("module @jit_step {}", 2, 4, "jax 0.10.2|cpu"),
        program_key("module @jit_step {}", 1, 8, "jax 0.10.2|cpu"),
        program_key("module @jit_step {}", 1, 4, "jax 0.10.3|cpu"),
    }
    assert key not in others and len(others) == 4


if __name__ == "__main__":
    _group_step(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])


def test_a_process_keeps_its_compiled_programs_loaded_between_runs():
    """A learner kept warm runs the next run's update without loading or compiling it
    again; a program with the same text but another argument structure is its own."""
    import jax
    import jax.numpy as jnp

    from workbench.learn import compile_cache

    def make_update():
        def total(tree):
            return sum(jnp.sum(leaf) for leaf in jax.tree.leaves(tree))
        return total

    total = make_update()
    x = jnp.ones(4)
    first = compile_cache.load_or_compile(jax.jit(total).lower((x, x)))
    # A new function object, as a new run's learner makes: the same program.
    again = compile_cache.load_or_compile(jax.jit(make_update()).lower((x, x)))
    assert again is first and float(again((x, x))) == 8.0
    as_dict = compile_cache.load_or_compile(jax.jit(total).lower({"a": x, "b": x}))
    assert as_dict is not first and float(as_dict({"a": x, "b": x})) == 8.0
    # Only the most recent programs stay loaded.
    for size in range(5, 5 + compile_cache.IN_MEMORY_PROGRAMS):
        compile_cache.load_or_compile(jax.jit(total).lower((jnp.ones(size),)))
    assert compile_cache.load_or_compile(jax.jit(total).lower((x, x))) is not first


def test_a_learner_of_the_same_setup_but_its_seed_reuses_the_lowered_programs(monkeypatch):
    """A learner kept warm traces the next run's programs only if they differ: another seed
    is the same programs (and the same result as tracing again), another batch is not,
    and a setup that cannot be pickled here (a loss defined in a notebook) is always
    traced."""
    import jax
    import numpy as np

    from workbench.algos import ppo as ppo_module
    from workbench.engine import TrainConfig
    from workbench.engine.plan import plan_run
    from workbench.learn import learner as learner_module
    from workbench.learn.actors_mode import BatchLearner, LocalSource

    traced = []
    lower = BatchLearner._lower
    monkeypatch.setattr(BatchLearner, "_lower", lambda self: traced.append(1) or lower(self))
    monkeypatch.setattr(learner_module, "_lowered_programs", learner_module.OrderedDict())

    def built(config: TrainConfig) -> BatchLearner:
        learner = BatchLearner(plan_run(config).learner_setup(1, "batch"), LocalSource([]))
        learner.compile()
        return learner

    first = built(TrainConfig(seed=1, envs_per_chip=4, rollout_length=8))
    other_seed = built(TrainConfig(seed=2, envs_per_chip=4, rollout_length=8))
    assert len(traced) == 1
    # The seed is in the state, not in the programs.
    params = [jax.tree.leaves(learner.policy_numpy()) for learner in (first, other_seed)]
    assert not all(np.array_equal(a, b) for a, b in zip(*params, strict=True))
    built(TrainConfig(seed=1, envs_per_chip=8, rollout_length=8))
    assert len(traced) == 2

    def notebook_loss(params, apply_fn, batch, config):
        return ppo_module.ppo_loss(params, apply_fn, batch, config)

    algorithm = ppo_module.with_loss(notebook_loss)
    setup = plan_run(TrainConfig(seed=1, envs_per_chip=4, rollout_length=8)).learner_setup(
        1, "batch")
    setup = learner_module.dataclasses.replace(
        setup, agent=learner_module.dataclasses.replace(setup.agent, algorithm=algorithm))
    assert learner_module.program_identity(setup) is None
    for _ in range(2):
        BatchLearner(setup, LocalSource([])).compile()
    assert len(traced) == 4
