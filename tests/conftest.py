"""Shared fixtures: one simulated GKE TPU cluster for the whole session (starting one
costs tens of seconds on a 2-core machine), with the slices the tests contend for."""

from __future__ import annotations

import os
import signal
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
