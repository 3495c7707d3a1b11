"""Both ways of keeping chips equal compute the same update as one device would, for any
algorithm's update, and both carry any chip's requests (stop, checkpoint) to every chip.

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
    from workbench.algos import LOCAL, Spaces, Trajectory
    from workbench.algos.normalize import init_stats
    from workbench.algos.policies import make_policy
    from workbench.algos.ppo import PPOConfig, PPOState, make_update
    from workbench.learn import sync

    rng = np.random.default_rng(0)
    T, N = 16, 8
    traj = Trajectory(
        obs=rng.normal(size=(T, N, 4)).astype(np.float32),
        actions=rng.integers(0, 2, (T, N)).astype(np.int32),
        rewards=np.ones((T, N), np.float32),
        terminated=rng.random((T, N)) < 0.05,
        truncated=np.zeros((T, N), bool),
        valid=np.ones((T, N), bool),
        extras={"log_prob": np.full((T, N), -0.69, np.float32),
                "value": rng.normal(size=(T, N)).astype(np.float32)},
        last_obs=rng.normal(size=(N, 4)).astype(np.float32),
    )
    config = PPOConfig(num_epochs=1, num_minibatches=1, normalize_advantages=False,
                       normalize_observations=True, scale_rewards=True)
    policy = make_policy(Spaces((4,), "discrete", num_actions=2), config)
    opt = optax.sgd(0.5)  # plain SGD: unlike Adam, a wrongly scaled gradient shows
    params = policy.network.init(jax.random.PRNGKey(0), traj.obs[0])
    state = PPOState(params, opt.init(params), init_stats((4,)), init_stats(()))
    update = make_update(policy, opt, config)
    key = jax.random.PRNGKey(1)
    reference, _ = jax.jit(lambda s, t, k: update(s, t, k, LOCAL))(state, traj, key)

    mesh = Mesh(np.array(jax.devices()), ("chips",))
    specs = jax.tree.map(lambda _: P(None, "chips"), traj._replace(last_obs=None))
    specs = specs._replace(last_obs=P("chips"))
    for strategy in sync.STRATEGIES:
        chip_update = sync.chip_update(update, strategy, "chips")
        sharded = jax.jit(jax.shard_map(chip_update, mesh=mesh,
                                        in_specs=(P(), specs, P(), P("chips")),
                                        out_specs=(P(), P(), P()),
                                        check_vma=sync.checks_replication(strategy)))
        # Chip 2 asks to stop, chip 3 to checkpoint (one row of request flags per chip).
        requests = jnp.array([[0, 0], [0, 0], [1, 0], [0, 1]])
        got, metrics, agreed = sharded(state, traj, key, requests)
        # The parameters and the running statistics (averaged over chips) alike.
        diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in
                   zip(jax.tree.leaves(got), jax.tree.leaves(reference)))
        print(strategy, diff)
        print(strategy + "-agreed", "".join(str(int(a)) for a in agreed))
        _, _, agreed = sharded(state, traj, key, jnp.zeros((4, 2), jnp.int32))
        print(strategy + "-none", "".join(str(int(a)) for a in agreed))
    print("auto-cpu", sync.resolve("auto", "cpu"))
    print("auto-tpu", sync.resolve("auto", "tpu"))
    """
)


def test_per_minibatch_all_reduce_and_batch_gather_match_one_device():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         timeout=300, env={"JAX_PLATFORMS": "cpu", "PATH": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    found = dict(line.split() for line in out.stdout.strip().splitlines())
    assert float(found["gradients"]) < 1e-5, found
    assert float(found["batch"]) < 1e-5, found
    # One chip's requests (stop, checkpoint) reach every chip through the update's own
    # collectives.
    for strategy in ("gradients", "batch"):
        assert found[f"{strategy}-agreed"] == "11" and found[f"{strategy}-none"] == "00"
    # The driver resolves "auto" once: gather on CPU learners, gradients on TPUs.
    assert (found["auto-cpu"], found["auto-tpu"]) == ("batch", "gradients")
