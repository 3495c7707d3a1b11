"""The environment each learner really ends with, and the mesh it joins, on the simulated
slice: what Ray and the simulated GKE hosts set, corrected the way a TPU slice needs.

The CPU backend forms a mesh whatever the TPU variables say, so these tests read the
variables themselves from every learner process of a real run and hold them against
:func:`workbench.tpu.process_env.chip_layout` (whose values are table-tested against JAX's
and pytorch/xla's own in tests/test_process_env.py).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import ray

import workbench as wb
from workbench.learn.joined_mesh import (
    ExpectedMesh,
    MeshMismatchError,
    MeshView,
    check_views,
    compare,
)
from workbench.tpu.process_env import chip_layout

# Ray's one-chip mask makes each process a TPU slice of its own; none may be left.
RAYS_ONE_CHIP_BOUNDS = ("TPU_CHIPS_PER_HOST_BOUNDS", "TPU_HOST_BOUNDS")


# Set by JAX and libtpu themselves, not by the workbench: JAX on a machine without TPU
# chips (jax/_src/cloud_tpu_init.py), libtpu's package when it is imported (libtpu/__init__).
SET_BY_JAX = ("TPU_SKIP_MDS_QUERY", "TPU_LIBRARY_PATH")


def _final_environment(report) -> dict[str, str]:
    return {k: v for k, v in report.mesh.tpu_environment if k not in SET_BY_JAX}


def _expected_environment(shape, reports, rank: int) -> dict[str, str]:
    mine = chip_layout(shape, [r.process for r in reports]).for_rank(rank)
    environment = dict(reports[rank].process.environment)
    mine.apply(environment)
    return {k: v for k, v in environment.items()
            if k.startswith(("TPU_", "CLOUD_TPU_", "ALLOW_MULTIPLE_LIBTPU_LOAD"))}


def _check_learners(shape, reports) -> None:
    assert len(reports) == shape.chips
    process_ids = set()
    for rank, report in enumerate(reports):
        final = _final_environment(report)
        assert final == _expected_environment(shape, reports, rank), f"rank {rank}"
        assert not set(RAYS_ONE_CHIP_BOUNDS) & set(final), final
        assert final["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "1,1,1"
        assert len(final["TPU_PROCESS_ADDRESSES"].split(",")) == shape.chips
        assert final["CLOUD_TPU_TASK_ID"] == str(report.mesh.process_index)
        process_ids.add(report.mesh.process_index)
        assert report.mesh.devices == shape.chips and report.mesh.local_devices == 1
        assert report.mesh.problems == ()
    assert process_ids == set(range(shape.chips))


@pytest.mark.slow
def test_every_learner_of_a_run_ends_with_the_tpu_environment_of_its_chip(cluster):
    tpu_slice = wb.reserve("v6e", "2x2", cpus_per_chip=1, keep_learners=True)
    try:
        config = wb.TrainConfig(mode="anakin", env="workbench/CartPole-v1", envs_per_chip=8,
                                rollout_length=8, total_env_steps=8 * 8 * 4 * 2, eval_every=0)
        result = wb.train(tpu_slice, config)
        assert result.chips == 4
        learners = [ray.get_actor(f"{tpu_slice.name}:a0:learner-{rank}")
                    for rank in range(tpu_slice.num_chips)]
        reports = ray.get([learner.join_report.remote() for learner in learners])
        _check_learners(tpu_slice.shape, reports)
        # The simulated host carries what GKE and Ray give a real one.
        first = reports[0].process.environment
        assert first["TPU_ACCELERATOR_TYPE"] == "v6e-4" and first["TPU_TOPOLOGY"] == "2x2"
        assert first["TPU_CHIPS_PER_HOST_BOUNDS"] == "1,1,1"  # as Ray set it, before the fix
    finally:
        tpu_slice.release()


@pytest.mark.slow
def test_doctor_mesh_on_a_multi_host_slice_prints_every_process_and_a_psum(cluster):
    """``workbench doctor --mesh`` from a second process, on the two-host v5p 2x2x2."""
    done = subprocess.run(
        [sys.executable, "-m", "workbench.cli", "doctor", "--mesh", "--address",
         cluster.address, "--generation", "v5p", "--topology", "2x2x2"],
        capture_output=True, text=True, timeout=300,
        env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    out = done.stdout
    assert "form one mesh" in out and "do NOT" not in out
    assert out.count("psum over every chip = 36 (expected 36)") == 8  # 1+2+...+8
    assert out.count("TPU_CHIPS_PER_PROCESS_BOUNDS=1,1,1") == 8
    assert out.count("TPU_WORKER_HOSTNAMES=") == 8
    for process in range(8):
        assert f"CLOUD_TPU_TASK_ID={process}\n" in out
    assert "TPU_HOST_BOUNDS=" not in out
    # Nothing of the check is left on the cluster.
    assert not [pg for pg in ray.util.placement_group_table().values()
                if pg["state"] != "REMOVED"]


def test_a_rank_that_sees_another_mesh_fails_the_start_with_what_every_rank_saw():
    expected = ExpectedMesh(devices=4, processes=4, process_index=1, local_devices=1)
    alone = MeshView(rank=1, platform="tpu", devices=1, processes=1, process_index=0,
                     local_devices=1, local_device_ids=(0,), tpu_environment=())
    alone = MeshView(**{**alone.__dict__, "problems": compare(alone, expected)})
    fine = MeshView(rank=0, platform="tpu", devices=4, processes=4, process_index=0,
                    local_devices=1, local_device_ids=(0,), tpu_environment=())
    check_views([fine], "v6e 2x2")
    with pytest.raises(MeshMismatchError) as raised:
        check_views([fine, alone], "v6e 2x2")
    message = str(raised.value)
    assert "1 of 2 ranks differ" in message
    assert "devices 1, expected 4" in message and "process index 0, expected 1" in message
    assert "rank 0: tpu, 4 devices" in message and "workbench doctor --mesh" in message
