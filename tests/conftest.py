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
import threading

import pytest
import ray

import workbench as wb

SESSION_SLICES = [("v6e", "4x4"), ("v6e", "2x4"), ("v6e", "2x2"), ("v6e", "2x2"),
                  ("v5p", "2x2x2")]


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


def live_placement_groups() -> list[str]:
    table = ray.util.placement_group_table()
    return [pg_id for pg_id, pg in table.items() if pg["state"] != "REMOVED"]


def live_actors() -> list[str]:
    return list(live_actor_names())


def live_actor_names() -> dict[str, str]:
    """Every live actor's id and its name ("" for an unnamed one)."""
    return {actor_id: a.get("Name", "") for actor_id, a in live_actor_records().items()}


def live_actor_records() -> dict[str, dict]:
    """Every live actor's record in the GCS actor table (name, class, pid...), by id."""
    # The GCS actor table: the state API proper needs the dashboard, which the simulated
    # cluster leaves off to save memory.
    from ray._private.state import actors

    return {actor_id: a for actor_id, a in actors().items() if a["State"] != "DEAD"}


def watch_stderr(process, lines: list[str]) -> threading.Thread:
    """Collect a child's stderr into ``lines`` as it comes, in a thread."""
    # Chunks, not lines: the progress bar redraws with carriage returns.
    def read() -> None:
        while chunk := os.read(process.stderr.fileno(), 4096):
            lines.append(chunk.decode(errors="replace"))

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def start_until_progress(command: list[str], env: dict, timeout_s: float = 240.0):
    """Start a training command and wait until its progress bar shows a return (its first
    update is done); returns the process and its stderr so far (still growing)."""
    import subprocess
    import time

    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, env=env)
    lines: list[str] = []
    watch_stderr(process, lines)
    deadline = time.monotonic() + timeout_s
    while not any("ret=" in line for line in lines):
        assert process.poll() is None, "".join(lines)
        assert time.monotonic() < deadline, "".join(lines)
        time.sleep(0.5)
    return process, lines


@pytest.fixture
def python_ctrl_c():
    """Python's own Ctrl-C handler for the test: an interrupt must become a
    KeyboardInterrupt, whatever an earlier test in this process installed (a full run
    was seen to leave another handler in place)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
