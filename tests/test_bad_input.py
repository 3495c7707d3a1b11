"""Input a user can get wrong, through the Python API and the command line: each case gives
one clear error that names what was asked and what is valid, and leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

import workbench as wb
from workbench.engine import TrainConfig, train
from workbench.engine.checkpoint import CheckpointError, require_checkpoint

WORKBENCH = str(Path(sys.executable).with_name("workbench"))
V6E_TOPOLOGIES = "Valid v6e topologies: 1x1, 2x2, 2x4"


# -- the catalog: generations and topologies ---------------------------------------------

@pytest.mark.parametrize(
    ("generation", "topology", "expected"),
    [
        ("v9", "2x2", ["Unknown TPU generation 'v9'", "Valid generations: v4, v5e, v5p, v6e"]),
        (None, "2x2", ["must be a string", "got None", "Valid generations"]),
        ("", "2x2", ["Unknown TPU generation ''", "Valid generations"]),
        ("v6e", "3x3", ["'3x3' is not a valid v6e slice", V6E_TOPOLOGIES]),
        ("v6e", "2x2; rm -rf /", ["'2x2; rm -rf /' is not of the form AxB", V6E_TOPOLOGIES]),
        ("v6e", "__import__('os')", ["\"__import__('os')\" is not of the form", V6E_TOPOLOGIES]),
        ("v6e", "$(reboot)", ["'$(reboot)' is not of the form", V6E_TOPOLOGIES]),
        ("v6e", "2x2x2", ["v6e slices have 2D topologies", "It exists on v4, v5p, v7x"]),
        ("v4", "2x2", ["v4 slices have 3D topologies", "Valid v4 topologies: 2x2x1"]),
        ("v6e", 4, ["must be a string such as '2x2'", "got 4 (int)", V6E_TOPOLOGIES]),
        ("v6e", "0x2", ["'0x2' is not of the form", "from 1 to 999"]),
        ("v6e", "1000x1000", ["'1000x1000' is not of the form", "from 1 to 999"]),
    ],
)
def test_a_bad_shape_is_refused_with_the_valid_choices(generation, topology, expected):
    with pytest.raises(wb.CatalogError) as caught:
        wb.parse_shape(generation, topology)
    message = str(caught.value)
    assert all(part in message for part in expected), message
    assert "\n" not in message


def test_a_pasted_blob_as_topology_gives_a_short_message():
    with pytest.raises(wb.CatalogError) as caught:
        wb.parse_shape("v6e", "2x2" * 3000)
    message = str(caught.value)
    assert len(message) < 400 and "(9002 characters)" in message and V6E_TOPOLOGIES in message


# -- starting the simulated cluster ------------------------------------------------------

@pytest.fixture
def nothing_started(tmp_path, monkeypatch):
    """Fails the test if a cluster (its simulator process or its temp dir) was started."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    children = {p.pid for p in psutil.Process().children()}
    yield
    assert {p.pid for p in psutil.Process().children()} <= children
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("slices", "options", "error", "expected"),
    [
        (("v6e", "2x2"), {}, ValueError,
         ["list of (generation, topology) pairs", "'v6e' in ('v6e', '2x2') is not a pair",
          "put its pair in a list"]),
        ("v6e 2x2", {}, ValueError, ["list of (generation, topology) pairs", "got 'v6e 2x2'"]),
        ([("v6e", "3x3")], {}, wb.CatalogError, ["'3x3' is not a valid v6e slice"]),
        ([("v6e", "2x2")], {"cpus_per_chip": 0}, ValueError,
         ["cpus_per_chip must be a positive whole number of logical CPUs per chip, got 0."]),
        ([("v6e", "2x2")], {"cpus_per_chip": 1.5}, ValueError, ["cpus_per_chip", "got 1.5"]),
        ([("v6e", "2x2")], {"timeout_s": -5}, ValueError,
         ["timeout_s must be a positive number of seconds, got -5."]),
        ([("v6e", "2x2")], {"head_cpus": -1}, ValueError,
         ["head_cpus must be a whole number >= 0, got -1."]),
    ],
)
def test_bad_cluster_arguments_start_nothing(nothing_started, slices, options, error, expected):
    with pytest.raises(error) as caught:
        wb.local_cluster(slices, connect=False, **options)
    assert all(part in str(caught.value) for part in expected), str(caught.value)


# -- connecting to a cluster -------------------------------------------------------------

def test_connect_without_any_address_says_where_an_address_comes_from(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(wb.ClusterError) as caught:
        wb.connect()
    message = str(caught.value)
    assert "No Ray cluster address" in message
    assert "RAY_ADDRESS" in message and "wb.local_cluster()" in message


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("head", "Ray address 'head' is not of the form host:port or ray://host:port"),
        ("head:99999", "Ray address 'head:99999' is not of the form host:port"),
        ("ray://:10001", "Ray address 'ray://:10001' is not of the form"),
        ("head:port", "Ray address 'head:port' is not of the form"),
        (12345, "A Ray address must be a string such as 'head:6379'"),
    ],
)
def test_a_malformed_address_is_refused_before_anything_connects(address, expected):
    with pytest.raises(wb.ClusterError) as caught:
        wb.connect(address)
    assert expected in str(caught.value)


@pytest.mark.parametrize("timeout_s", [-1, 0, float("nan"), "10"])
def test_connect_refuses_a_timeout_that_is_not_a_positive_number(timeout_s):
    with pytest.raises(ValueError) as caught:
        wb.connect("head:6379", timeout_s=timeout_s)
    assert f"timeout_s must be a positive number of seconds, got {timeout_s!r}" in str(
        caught.value)


def _fresh_python(code: str) -> str:
    """Run ``code`` in a new interpreter (not connected to any cluster); returns what it
    prints about the exception it expects."""
    wrapped = (f"import workbench as wb\ntry:\n    {code}\nexcept Exception as error:\n"
               "    print(type(error).__name__, error)\nelse:\n    print('no error')\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", wrapped], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_an_unreachable_address_says_what_to_check():
    out = _fresh_python("wb.connect('127.0.0.1:1', timeout_s=5)")
    assert out.startswith("ClusterError Cannot reach a Ray cluster at 127.0.0.1:1")
    assert "<head-service>:6379" in out and "wb.local_cluster()" in out


def test_reserving_without_a_cluster_says_how_to_get_one():
    out = _fresh_python("wb.reserve('v6e', '2x2', timeout_s=5)")
    assert out.startswith("SliceUnavailableError Not connected to a Ray cluster")
    assert "wb.connect(address)" in out and "wb.local_cluster()" in out


# -- reserving a slice -------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"timeout_s": -1}, "timeout_s must be a positive number of seconds, got -1."),
        ({"timeout_s": 0}, "timeout_s must be a positive number of seconds, got 0."),
        ({"timeout_s": "10"}, "timeout_s must be a positive number of seconds, got '10'."),
        ({"timeout_s": True}, "timeout_s must be a positive number of seconds, got True."),
        ({"timeout_s": float("inf")}, "timeout_s must be a positive number of seconds, got inf"),
        ({"cpus_per_chip": 0}, "cpus_per_chip must be a positive number of CPUs"),
        ({"cpus_per_chip": -2}, "cpus_per_chip must be a positive number of CPUs"),
        ({"keep_learners": "yes"}, "keep_learners must be True, False or None (the "
                                   "cluster's default), got 'yes'."),
    ],
)
def test_bad_reserve_arguments_hold_nothing(cluster, options, expected):
    with pytest.raises(ValueError) as caught:
        wb.reserve("v6e", "2x2", **options)
    assert expected in str(caught.value)


@pytest.mark.slow
def test_an_injection_attempt_as_topology_reserves_nothing(cluster):
    with pytest.raises(wb.CatalogError) as caught:
        wb.reserve("v6e", "2x2; rm -rf /", timeout_s=5)
    assert "'2x2; rm -rf /' is not of the form AxB" in str(caught.value)


@pytest.mark.slow
def test_a_shape_the_cluster_lacks_names_it_and_what_exists(cluster):
    with pytest.raises(wb.SliceUnavailableError) as caught:
        wb.reserve("v5p", "2x2x1", timeout_s=1)
    message = str(caught.value)
    assert "Could not reserve a v5p 2x2x1 slice (pod type v5p-8" in message
    assert "The cluster has no v5p-8 slice" in message
    assert "Other TPU slices:" in message and "v6e 4x4" in message
    assert "What to do:" in message


@pytest.mark.slow
def test_a_chip_rank_outside_the_slice_is_refused(cluster):
    with wb.reserve("v6e", "2x2", timeout_s=30) as tpu_slice:
        for rank in (4, -1, "0", True):
            with pytest.raises(ValueError) as caught:
                tpu_slice.scheduling(rank)
            assert f"Chip rank {rank!r} is not in this v6e 2x2 slice" in str(caught.value)
            assert "from 0 to 3" in str(caught.value)


# -- training configuration --------------------------------------------------------------

@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"total_env_steps": 0}, "total_env_steps must be a positive whole number, got 0."),
        ({"total_env_steps": -5}, "total_env_steps must be a positive whole number, got -5."),
        ({"total_env_steps": 1.5}, "total_env_steps must be a positive whole number, got 1.5."),
        ({"total_env_steps": "100"},
         "total_env_steps must be a positive whole number, got '100'."),
        ({"total_env_steps": True}, "total_env_steps must be a positive whole number, got True."),
        ({"envs_per_chip": 0}, "envs_per_chip must be a positive whole number, got 0."),
        ({"seed": -1}, "seed must be a whole number >= 0, got -1."),
        ({"sync": "fast"}, "sync must be 'auto', 'gradients' or 'batch', got 'fast'."),
        ({"resume": True}, "resume=True needs checkpoint_dir"),
    ],
)
def test_a_config_that_cannot_work_names_the_field(fields, expected):
    with pytest.raises(ValueError) as caught:
        TrainConfig(**fields).validate()
    assert expected in str(caught.value)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"env": "NoSuchEnv-v0"}, ["Unknown environment 'NoSuchEnv-v0'", "'CartPole-v1'"]),
        ({"env": ""}, ["env must be a gymnasium id such as 'CartPole-v1', got ''."]),
        ({"rollout_actors_per_host": 3},
         ["rollout_actors_per_host=3 does not divide the 4 chips", "use a divisor of 4"]),
    ],
)
def test_train_refuses_before_starting_any_actor(fresh_two_by_two, fields, expected):
    with pytest.raises(ValueError) as caught:
        train(fresh_two_by_two, TrainConfig(total_env_steps=1024, **fields))
    assert all(part in str(caught.value) for part in expected), str(caught.value)


@pytest.mark.slow
def test_train_on_a_released_slice_says_to_reserve_again(fresh_two_by_two):
    fresh_two_by_two.release()
    with pytest.raises(ValueError) as caught:
        train(fresh_two_by_two, TrainConfig(total_env_steps=1024))
    assert "This slice has been released; reserve a slice" in str(caught.value)


@pytest.mark.slow
def test_train_on_a_slice_with_one_cpu_per_chip_says_to_reserve_two(cluster):
    with wb.reserve("v6e", "2x2", timeout_s=30, cpus_per_chip=1) as tpu_slice, \
            pytest.raises(ValueError) as caught:
        train(tpu_slice, TrainConfig(total_env_steps=1024))
    assert "reserve with cpus_per_chip=2" in str(caught.value)


# -- checkpoints to resume from ----------------------------------------------------------

def test_resuming_from_what_is_not_a_checkpoint_says_which_case(tmp_path):
    missing = tmp_path / "missing"
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a checkpoint")
    (tmp_path / "empty").mkdir()
    cases = {
        str(missing): f"Checkpoint directory '{missing}' does not exist.",
        str(a_file): f"'{a_file}' is a file, not a checkpoint directory.",
        str(tmp_path / "empty"): f"'{tmp_path / 'empty'}' holds no workbench checkpoint",
        "": "checkpoint_dir must be a directory path, got ''.",
    }
    for directory, expected in cases.items():
        with pytest.raises(CheckpointError) as caught:
            require_checkpoint(directory)
        assert expected in str(caught.value)
        assert "leave resume off to start fresh" in str(caught.value)
    assert not missing.exists()


# -- the command line --------------------------------------------------------------------

CLI_CASES = [
    (["train", "--total-env-steps", "0"],
     "total_env_steps (--total-env-steps) must be a positive whole number, got 0."),
    (["train", "--total-env-steps", "-5"],
     "total_env_steps (--total-env-steps) must be a positive whole number, got -5."),
    (["train", "--total-env-steps", "1.5"],
     "argument --total-env-steps: must be a whole number, got '1.5'"),
    (["train", "--total-env-steps", "lots"],
     "argument --total-env-steps: must be a whole number, got 'lots'"),
    (["train", "--envs-per-chip", "0"], "envs_per_chip (--envs-per-chip) must be a positive whole"),
    (["train", "--rollout-length", "-1"], "rollout_length (--rollout-length) must be a positive"),
    (["train", "--checkpoint-every", "-1"],
     "checkpoint_every (--checkpoint-every) must be a whole number >= 0, got -1."),
    (["train", "--seed", "-1"], "seed (--seed) must be a whole number >= 0, got -1."),
    (["train", "--seed", "99999999999"], "seed (--seed) must be at most 2147483647"),
    (["train", "--reserve-timeout", "-1"],
     "argument --reserve-timeout: must be a positive number of seconds, got '-1'"),
    (["train", "--reserve-timeout", "nan"],
     "argument --reserve-timeout: must be a positive number of seconds, got 'nan'"),
    (["train", "--sync", "fast"],
     "argument --sync: invalid choice: 'fast' (choose from 'auto', 'gradients', 'batch')"),
    (["train", "--mode", "sebulba"], "argument --mode: invalid choice: 'sebulba'"),
    (["train", "--generation", "v9"], "Unknown TPU generation 'v9'. Valid generations: v4"),
    (["train", "--topology", "2x2; rm -rf /"], "'2x2; rm -rf /' is not of the form AxB"),
    (["train", "--topology", "__import__('os')"], "\"__import__('os')\" is not of the form"),
    (["train", "--generation", "v4", "--topology", "2x2"], "v4 slices have 3D topologies"),
    (["train", "--algo", "sac"], "Unknown algorithm 'sac'; available: impala, ppo, pqn"),
    (["train", "--learning-rate", "-1"], "learning_rate must be a finite number > 0, got -1.0."),
    (["train", "--learning-rate", "fast"],
     "argument --learning-rate: must be a number, got 'fast'"),
    (["train", "--gamma", "1.5"], "gamma must be a number from 0 to 1, got 1.5."),
    (["train", "--hidden-sizes", "64,x"],
     "argument --hidden-sizes: must be comma-separated whole numbers such as 64,64"),
    (["train", "--num-minibatches", "5000"],
     "num_minibatches=5000 does not fit a batch of 1024 env steps per chip"),
    (["train", "--stop-at-target", "--env", "Acrobot-v1", "--target-return", "nan"],
     "target_return (--target-return) must be a finite number, got nan."),
    (["train", "--env", "Pendulum-v1", "--algo", "pqn"],
     "Pendulum-v1 has continuous actions, and pqn handles discrete actions only"),
    (["train", "--env", "NoSuchEnv-v0"], "Unknown environment 'NoSuchEnv-v0'"),
    (["train", "--mode", "anakin"], "Anakin mode steps JAX environments on the chip"),
    (["train", "--resume"], "resume=True needs checkpoint_dir"),
    (["train", "--resume", "--checkpoint-dir", "{tmp}/none"],
     "Checkpoint directory '{tmp}/none' does not exist."),
    (["train", "--resume", "--checkpoint-dir", "{tmp}"], "'{tmp}' holds no workbench checkpoint"),
    (["train", "--config", "{tmp}/missing.yaml"], "--config {tmp}/missing.yaml: cannot read it"),
    (["train", "--config", "{tmp}/typo.yaml"],
     "total_env_step is not a field of a run file (or ppo's section). Did you mean "
     "total_env_steps?"),
    (["train", "--config", "{tmp}/wrong-type.yaml"],
     "learning_rate (--learning-rate) must be a number, got 'fast'."),
    (["train", "--json", "{tmp}/no-such-folder/result.json"],
     "--json {tmp}/no-such-folder/result.json: the folder"),
    (["train", "--address", "head"], "Ray address 'head' is not of the form host:port"),
    (["train", "--address", "head:70000"], "Ray address 'head:70000' is not of the form"),
    (["train", "--address", "127.0.0.1:1"], "Cannot reach a Ray cluster at 127.0.0.1:1"),
    (["demo", "--total-env-steps", "0"], "argument --total-env-steps: must be a positive whole"),
    (["demo", "--topology", "9x9"], "'9x9' is not a valid v6e slice"),
    (["topologies", "--generation", "v6e; rm -rf /"], "Unknown TPU generation 'v6e; rm -rf /'"),
    (["train", "--topolgy", "2x2"], "unrecognized arguments: --topolgy 2x2"),
    ([], "the following arguments are required: command"),
]


@pytest.mark.parametrize(("args", "expected"), CLI_CASES,
                         ids=[" ".join(args) or "(nothing)" for args, _ in CLI_CASES])
def test_the_cli_refuses_bad_input_in_one_line_without_starting_anything(
    tmp_path, args, expected
):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    expected = expected.replace("{tmp}", str(tmp_path))
    (tmp_path / "typo.yaml").write_text("env: CartPole-v1\ntotal_env_step: 1000\n")
    (tmp_path / "wrong-type.yaml").write_text("ppo:\n  learning_rate: fast\n")
    # A cluster the command started would live under this TMPDIR.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["TMPDIR"] = str(tmp_path)
    done = subprocess.run([WORKBENCH, *args], capture_output=True, text=True, timeout=60,
                          env=env)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert expected in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # one paragraph
    assert "Starting a simulated cluster" not in done.stderr
    leftovers = [p.pid for p in psutil.process_iter(["cmdline"])
                 if str(tmp_path) in " ".join(p.info["cmdline"] or ())]
    assert leftovers == []
    assert not any(p.name.startswith("wb-") for p in tmp_path.iterdir())


def test_a_run_file_and_flags_make_one_config(tmp_path):
    from workbench import algos, cli

    run_file = tmp_path / "run.yaml"
    run_file.write_text("env: Acrobot-v1\ntotal_env_steps: 20000\ntopology: 2x4\n"
                        "ppo:\n  learning_rate: 0.001\n  hidden_sizes: [32, 32]\n")
    argv = ["train", "--config", str(run_file), "--seed", "3", "--gamma", "0.9",
            "--no-anneal-lr"]
    args = cli.build_parser(argv).parse_args(argv)
    config, shape = cli.train_config_from(args, algos.get("ppo"))
    assert (config.env, config.total_env_steps, config.seed) == ("Acrobot-v1", 20_000, 3)
    assert shape.topology == "2x4" and shape.generation.name == "v6e"
    ppo = config.algo_config
    assert (ppo.learning_rate, ppo.hidden_sizes, ppo.gamma, ppo.anneal_lr) == \
        (0.001, (32, 32), 0.9, False)
    # Flags win over the file.
    argv = ["train", "--config", str(run_file), "--total-env-steps", "5000"]
    config, _ = cli.train_config_from(cli.build_parser(argv).parse_args(argv), algos.get("ppo"))
    assert config.total_env_steps == 5000


def test_every_config_field_is_a_flag_with_its_docstring_as_help():
    from workbench import cli
    from workbench.algos.ppo import PPOConfig
    from workbench.engine.fields import fields

    done = subprocess.run([WORKBENCH, "train", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    # --algo's help lists the registered names instead of its docstring; a field no text
    # can spell (PPO's own flax module) is set from Python only.
    for cls, skip in ((TrainConfig, (*cli.NOT_FLAGS, "algo")), (PPOConfig, ())):
        for info in fields(cls).values():
            if info.name in skip or info.kind == "other":
                continue
            assert info.flag in text, f"{info.flag} missing from workbench train --help"
            assert " ".join(info.doc.split()[:4]) in text, f"{info.name}'s help is not its doc"
    assert "(default: 0.0005)" in text and "(default: 64,64)" in text


def test_workbench_version_matches_the_package():
    import workbench

    done = subprocess.run([WORKBENCH, "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"workbench {workbench.__version__}"
    assert workbench.__version__[0].isdigit()
