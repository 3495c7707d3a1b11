"""Both ways of keeping chips equal compute the same update as one device would, and
both carry any chip's request to stop to every chip.

Runs in a child process with four CPU devices, since this process's JAX already has one.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import jax
    jax.config.update("jax_num_cpu_devices", 4)
    import numpy as np
    import jax.numpy as jnp
    from jax.sharding import Mesh, PartitionSpec as P
    import optax
    from workbench.algos.ppo import ActorCritic, PPOConfig, Trajectory, init_state, make_update

    rng = np.random.default_rng(0)
    T, N = 16, 8
    traj = Trajectory(
        obs=rng.normal(size=(T, N, 4)).astype(np.float32),
        actions=rng.integers(0, 2, (T, N)).astype(np.int32),
        log_probs=np.full((T, N), -0.69, np.float32),
        values=rng.normal(size=(T, N)).astype(np.float32),
        rewards=np.ones((T, N), np.float32),
        terminated=rng.random((T, N)) < 0.05,
        truncated=np.zeros((T, N), bool),
        valid=np.ones((T, N), bool),
        last_value=rng.normal(size=N).astype(np.float32),
    )
    config = PPOConfig(num_epochs=1, num_minibatches=1, normalize_advantages=False)
    net = ActorCritic(2)
    opt = optax.sgd(0.5)  # plain SGD: unlike Adam, a wrongly scaled gradient shows
    state = init_state(net, opt, traj.obs[0, 0], seed=0)
    key = jax.random.PRNGKey(1)
    reference, _ = jax.jit(make_update(net, opt, config))(state, traj, key)

    mesh = Mesh(np.array(jax.devices()), ("chips",))
    specs = Trajectory(*([P(None, "chips")] * 8), last_value=P("chips"))
    for gather in (False, True):
        update = make_update(net, opt, config, axis_name="chips", gather_batch=gather)
        sharded = jax.jit(jax.shard_map(update, mesh=mesh, in_specs=(P(), specs, P(), P("chips")),
                                        out_specs=(P(), P()), check_vma=not gather))
        name = "gather" if gather else "gradients"
        got, metrics = sharded(state, traj, key, jnp.array([0, 0, 1, 0]))
        diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in
                   zip(jax.tree.leaves(got.params), jax.tree.leaves(reference.params)))
        print(name, diff)
        print(name + "-one-stops", float(metrics["stop"]))
        _, metrics = sharded(state, traj, key, jnp.zeros(4, jnp.int32))
        print(name + "-none-stops", float(metrics["stop"]))
    """
)


def test_per_minibatch_all_reduce_and_batch_gather_match_one_device():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         timeout=300, env={"JAX_PLATFORMS": "cpu", "PATH": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    diffs = dict(line.split() for line in out.stdout.strip().splitlines())
    assert float(diffs["gradients"]) < 1e-5, diffs
    assert float(diffs["gather"]) < 1e-5, diffs
    # One chip's wish to stop reaches every chip through the update's own collectives.
    for mode in ("gradients", "gather"):
        assert float(diffs[f"{mode}-one-stops"]) > 0 and float(diffs[f"{mode}-none-stops"]) == 0
