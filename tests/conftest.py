"""Shared fixtures: one simulated GKE TPU cluster for the whole session (starting one
costs tens of seconds on a 2-core machine), with the slices the tests contend for.

Two tiers: a test that starts or joins a Ray cluster, or trains for long, is marked
``slow``; ``-m "not slow"`` runs the rest in minutes. The hooks below fail an unmarked
test that asks for a cluster fixture, calls ``ray.init`` or starts the simulator or a
``ray start`` node, so a forgotten marker shows instead of slowing the fast tier."""

from __future__ import annotations

import functools
import os
import signal
import subprocess

import pytest
from support.cluster_state import live_actors, live_placement_groups

import workbench as wb

SESSION_SLICES = [("v6e", "4x4"), ("v6e", "2x4"), ("v6e", "2x2"), ("v6e", "2x2"),
                  ("v5p", "2x2x2")]


@pytest.fixture(scope="session", autouse=True)
def libtpu_writes_no_logs():
    """libtpu (installed for the TPU-compile tests) writes its logs to the machine's
    /tmp/tpu_logs unless told otherwise, even in a CPU process that only looks for chips;
    every Ray node started later links that folder and streams it to its drivers. Nothing
    the tests start writes there."""
    previous = os.environ.get("TPU_LOG_DIR")
    os.environ["TPU_LOG_DIR"] = "disabled"
    yield
    if previous is None:
        os.environ.pop("TPU_LOG_DIR", None)
    else:
        os.environ["TPU_LOG_DIR"] = previous


@pytest.fixture(scope="session", autouse=True)
def runs_folder(tmp_path_factory):
    """Runs get their folders (checkpoints, records) here, not in the checkout; every
    process the tests start (CLIs, kernels) inherits it."""
    import os

    folder = tmp_path_factory.mktemp("runs")
    previous = os.environ.get("WORKBENCH_RUNS")
    os.environ["WORKBENCH_RUNS"] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop("WORKBENCH_RUNS", None)
    else:
        os.environ["WORKBENCH_RUNS"] = previous


@pytest.fixture(scope="session")
def sim_cluster():
    cluster = wb.local_cluster(SESSION_SLICES)
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.fixture
def cluster(sim_cluster):
    """The session cluster, checked to hold no placement group before and after a test."""
    assert live_placement_groups() == [], "a previous test left a placement group behind"
    yield sim_cluster
    assert live_placement_groups() == [], "this test left a placement group behind"


# -- slices the tests train on ------------------------------------------------------

def _reserve_two_by_two():
    # 2 CPUs per chip: a learner and a rollout actor beside each chip.
    return wb.reserve("v6e", "2x2", timeout_s=60, cpus_per_chip=2)


@pytest.fixture(scope="module")
def two_by_two(sim_cluster):
    """A v6e 2x2 (4 chips on 1 host, 2 CPUs per chip) that a module's tests share:
    reserved when the first of them asks for it, released after the module's last. The
    session cluster has two, so a test can still reserve the other. A module can extend
    it with a fixture of the same name that asks for it (test_engine.py starts the
    slice's learners that way)."""
    with _reserve_two_by_two() as tpu_slice:
        yield tpu_slice


@pytest.fixture
def fresh_two_by_two(cluster):
    """A v6e 2x2 like ``two_by_two``, but reserved for one test alone, which may release
    it. After the test, no actor it started (a learner, a rollout actor, a metrics board)
    is left running, and (``cluster``) no placement group."""
    actors = set(live_actors())
    with _reserve_two_by_two() as tpu_slice:
        yield tpu_slice
    assert set(live_actors()) == actors, "the test left an actor running on its slice"


# -- the fast tier: no Ray cluster without the slow marker -------------------------------

# Fixtures that start or join a Ray cluster (the session's simulated one, and
# test_ray_client's `ray start` one); any fixture built on them is in a test's closure too.
CLUSTER_FIXTURES = frozenset({"sim_cluster", "cluster", "kuberay"})
_GUARDS = pytest.StashKey[pytest.MonkeyPatch]()


def _not_slow(item: pytest.Item, what: str) -> str:
    return (f"{item.nodeid} {what}, but is not marked slow. A test that starts or joins a "
            "Ray cluster belongs to the slow tier, which `-m \"not slow\"` leaves out: "
            "mark it @pytest.mark.slow (or its module: pytestmark = pytest.mark.slow).")


def _cluster_command(args) -> str | None:
    """What a command line starts, if it is the simulator or a `ray start` node."""
    if isinstance(args, (str, bytes, os.PathLike)):
        argv = os.fsdecode(args).split()
    else:
        argv = [os.fsdecode(a) for a in args]
    if any(a == "workbench.tpu.simulator" or a.endswith("workbench/tpu/simulator.py")
           for a in argv):
        return "the simulated cluster (workbench.tpu.simulator)"
    if len(argv) > 1 and os.path.basename(argv[0]) == "ray" and argv[1] == "start":
        return "a Ray node (`ray start`)"
    return None


def _install_guards(item: pytest.Item) -> pytest.MonkeyPatch:
    """ray.init, and starting the simulator or a `ray start` node, fail the test."""
    guards = pytest.MonkeyPatch()

    def refuse_init(*args, **kwargs):
        pytest.fail(_not_slow(item, "called ray.init (it connects to a Ray cluster, or starts "
                                    "one)"), pytrace=False)

    import ray._private.worker

    guards.setattr(ray, "init", refuse_init)
    guards.setattr(ray._private.worker, "init", refuse_init)
    popen_init = subprocess.Popen.__init__

    @functools.wraps(popen_init)
    def checked_popen_init(self, *args, **kwargs):
        started = _cluster_command(args[0] if args else kwargs.get("args", ()))
        if started:
            pytest.fail(_not_slow(item, f"starts {started}"), pytrace=False)
        popen_init(self, *args, **kwargs)

    guards.setattr(subprocess.Popen, "__init__", checked_popen_init)
    return guards


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before any fixture of an unmarked test is set up: it asks for no cluster fixture
    (directly or through another fixture), and, through its setup and call, it cannot
    connect Ray or start a cluster's processes."""
    if item.get_closest_marker("slow") is not None:
        return
    asked = sorted(CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())))
    if asked:
        pytest.fail(_not_slow(item, f"uses the Ray cluster fixture {', '.join(asked)}"),
                    pytrace=False)
    item.stash[_GUARDS] = _install_guards(item)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    # Off before teardown: a session or module fixture's teardown (stopping the session
    # cluster) can fall in an unmarked test's teardown.
    guards = item.stash.get(_GUARDS, None)
    if guards is not None:
        guards.undo()
        del item.stash[_GUARDS]


@pytest.fixture
def python_ctrl_c():
    """Python's own Ctrl-C handler for the test: an interrupt must become a
    KeyboardInterrupt, whatever an earlier test in this process installed (a full run
    was seen to leave another handler in place)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
