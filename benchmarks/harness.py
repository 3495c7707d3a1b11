"""What the benchmarks share: wall-clock timing, medians and ratios over runs, running a
side (the workbench, RLlib, a one-process peer) in a subprocess of its own with its whole
process tree sampled, the start of a private Ray instance, of an RLlib algorithm and of a
simulated v6e 2x2, the machine and code a result was measured on, and the JSON result.

The scripts import it as ``harness``: run as ``python benchmarks/bench_x.py``, Python
itself puts ``benchmarks/`` first on ``sys.path``. Nothing heavy is imported at module
level (Ray, RLlib, torch, JAX and the workbench are imported where they are used), so that
a worker's ``imports_s`` counts only what its own side imports.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil

Record = dict[str, Any]

ROOT = Path(__file__).resolve().parent.parent
# What a worker exits with when Ray or the simulated cluster did not come up: the parent
# starts it again (see :func:`startup_phase`).
EXIT_STARTUP_FAILED = 75
# The training target's window: the mean return of the last 100 training episodes.
WINDOW = 100
EPISODE_RETURNS_KEY = "bench_episode_returns"
SIMULATED_CHIPS = 4  # v6e 2x2


# Timing.


class Stopwatch:
    """Wall seconds since it was made; used as a context manager, it stops at the end of
    the block (``with timed() as clock: ...`` then ``clock.s``)."""

    def __init__(self) -> None:
        self._started = time.perf_counter()
        self._stopped: float | None = None

    def __enter__(self) -> Stopwatch:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopped = time.perf_counter()

    @property
    def s(self) -> float:
        end = time.perf_counter() if self._stopped is None else self._stopped
        return end - self._started


def timed() -> Stopwatch:
    """A :class:`Stopwatch` started now."""
    return Stopwatch()


# Medians and ratios of several runs.


def median(values: Iterable[float | None], digits: int | None = 3,
           scale: float = 1.0) -> float | None:
    """The median of the known values (``None`` left out) times ``scale``, rounded to
    ``digits`` (not rounded when ``digits`` is ``None``); ``None`` when none is known."""
    known = [v for v in values if v is not None]
    if not known:
        return None
    value = statistics.median(known) * scale
    return value if digits is None else round(value, digits)


def ratio(numerator: float | None, denominator: float | None, digits: int = 3
          ) -> float | None:
    """``numerator / denominator`` rounded; ``None`` when either is unknown or the
    denominator is zero."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return round(numerator / denominator, digits)


def median_ratio(values: Iterable[float], peer_values: Iterable[float], digits: int = 3
                 ) -> float | None:
    """The ratio of the (unrounded) medians of a side's runs and of its peer's."""
    return ratio(median(values, None), median(peer_values, None), digits)


def round_or_none(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def finite_or_none(value: float, digits: int = 3) -> float | None:
    return None if math.isinf(value) or math.isnan(value) else round(value, digits)


def median_or_none(values: list[float | None], lower_is_better: bool = True) -> float | None:
    """Median over seeds where ``None`` (never reached) counts as the worst value."""
    worst = math.inf if lower_is_better else -math.inf
    return finite_or_none(statistics.median([worst if v is None else v for v in values]))


def reached(records: list[Record], key: str) -> str:
    """How many of the runs have ``key`` (a time to a target), as ``"n/runs"``."""
    return f"{sum(r.get(key) is not None for r in records)}/{len(records)}"


TRAINING_FIGURES = ("time_to_train_target_s", "env_steps_to_train_target",
                    "time_to_eval_target_s", "cold_start_s", "cold_start_with_imports_s",
                    "imports_s", "peak_rss_mib", "tree_cpu_s")
TARGETS_REACHED = (("train_target_reached", "time_to_train_target_s"),
                   ("eval_target_reached", "time_to_eval_target_s"))


def medians(records: list[Record], figures: Sequence[str] = TRAINING_FIGURES,
            targets: Sequence[tuple[str, str]] = TARGETS_REACHED) -> Record:
    """One side's medians over seeds: ``figures`` (lower is better), env-steps/s (higher
    is better) and, for each ``(name, key)`` of ``targets``, how many runs reached it."""
    out = {k: median_or_none([r.get(k) for r in records]) for k in figures}
    out["env_steps_per_s"] = median_or_none([r.get("env_steps_per_s") for r in records],
                                            lower_is_better=False)
    for name, key in targets:
        out[name] = reached(records, key)
    return out


def median_time_bounds(records: list[Record], key: str) -> tuple[float, float]:
    """Bounds on the median time to a target over seeds.

    A run that never reached it took longer than its whole training loop (``loop_s``), and
    than any time at all: the median of those stand-ins is a lower bound, the median with
    infinity in their place an upper bound. Both equal the median when every run got there.
    """
    spent = [r[key] if r.get(key) is not None else r.get("loop_s") or 0.0 for r in records]
    never = [r[key] if r.get(key) is not None else math.inf for r in records]
    return statistics.median(spent), statistics.median(never)


def time_ratio_bounds(peer: list[Record], ours: list[Record], key: str
                      ) -> tuple[float, float]:
    """Bounds on (the peer's median time to a target) / (ours)."""
    peer_low, peer_high = median_time_bounds(peer, key)
    our_low, our_high = median_time_bounds(ours, key)
    low = peer_low / our_high if our_high > 0 else math.inf
    high = peer_high / our_low if our_low > 0 else math.inf
    return low, high


def speedup_goal(peer: list[Record], ours: list[Record], key: str, need: float) -> Record:
    """Met when even the lower bound of the ratio reaches ``need``; not met when even the
    upper bound falls short; ``None`` when a target never reached leaves it open."""
    low, high = time_ratio_bounds(peer, ours, key)
    met = True if low >= need else False if high < need else None
    return {"ratio_bounds": [finite_or_none(low), finite_or_none(high)], "need": need,
            "met": met}


def at_least(value: float | None, bound: float) -> bool | None:
    return None if value is None else value >= bound


def at_most(value: float | None, bound: float) -> bool | None:
    return None if value is None else value <= bound


# Running a side in its own process, its whole process tree sampled from the parent.


class TreeSampler:
    """Samples the summed RSS of a process and all its descendants in a thread."""

    def __init__(self, root_pid: int, interval_s: float = 0.5) -> None:
        self.root = psutil.Process(root_pid)
        self.interval_s = interval_s
        self.peak_rss_bytes = 0
        self.peak_processes = 0
        self.samples = 0
        self.seen: dict[int, psutil.Process] = {root_pid: self.root}
        self.cpu_s: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def tree(self) -> list[psutil.Process]:
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        total, count = 0, 0
        for proc in self.tree():
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied), proc.oneshot():
                total += proc.memory_info().rss
                times = proc.cpu_times()
                self.cpu_s[proc.pid] = times.user + times.system
                count += 1
                self.seen.setdefault(proc.pid, proc)
        self.samples += 1
        self.peak_rss_bytes = max(self.peak_rss_bytes, total)
        self.peak_processes = max(self.peak_processes, count)

    def survivors(self) -> list[psutil.Process]:
        """Processes of the tree seen while sampling that still run (same pid and birth)."""
        return [p for p in self.seen.values() if p.is_running()]


def kill_processes(procs: list[psutil.Process], timeout_s: float = 10.0) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=timeout_s)


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child that must start its own Ray (or cluster),
    never join the one ``RAY_ADDRESS`` names; ``extra`` added."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(extra)
    return env


def worker_env() -> dict[str, str]:
    return child_env(RAY_USAGE_STATS_ENABLED="0")


def run_attempt(command: list[str], timeout_s: float, log_path: Path
                ) -> tuple[int | None, TreeSampler, int]:
    """Run one worker subprocess to the end (or the deadline) while sampling its tree.

    Returns its exit code (``None`` on timeout), the sampler, and how many of its processes
    outlived it and were killed.
    """
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                env=worker_env(), stdin=subprocess.DEVNULL)
        with TreeSampler(proc.pid) as sampler:
            try:
                returncode: int | None = proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                returncode = None
                kill_processes(sampler.tree())
        leftovers = sampler.survivors()
        kill_processes(leftovers)
    return returncode, sampler, len(leftovers)


def run_worker(kind: str, seed: int, options: list[str], timeout_s: float, log_dir: Path,
               startup_retries: int, script: Path) -> Record:
    """Run one side for one seed in a subprocess (``script --worker kind``); its record
    plus process-tree figures.

    A run whose Ray instance or cluster failed to come up is started again from scratch,
    at most ``startup_retries`` times; the count is in the record.
    """
    out = log_dir / f"{kind}-seed{seed}.json"
    command = [sys.executable, str(script), "--worker", kind, "--seed", str(seed),
               "--out", str(out), *options]
    out.unlink(missing_ok=True)  # an earlier pair's record must not stand in for this run
    failed_startup_s = 0.0
    for attempt in range(1, startup_retries + 2):
        log_path = log_dir / f"{kind}-seed{seed}-attempt{attempt}.log"
        clock = timed()
        returncode, sampler, leftovers = run_attempt(command, timeout_s, log_path)
        if returncode != EXIT_STARTUP_FAILED:
            break
        failed_startup_s += clock.s
    record: Record = json.loads(out.read_text()) if out.exists() and returncode == 0 else {}
    if not record:
        tail = log_path.read_text()[-3000:]
        record["error"] = f"worker exited with {returncode}; log {log_path}:\n{tail}"
    record.update(
        seed=seed,
        startup_attempts=attempt,
        failed_startup_s=round(failed_startup_s, 1),
        peak_rss_mib=round(sampler.peak_rss_bytes / 2**20, 1),
        peak_processes=sampler.peak_processes,
        rss_samples=sampler.samples,
        tree_cpu_s=round(sum(sampler.cpu_s.values()), 1),
        leftover_processes_killed=leftovers,
    )
    return record


class Invocation:
    """One invocation of a benchmark whose sides run seed by seed in subprocesses of
    ``script`` (:func:`run_worker`): where their logs go, and what the result says about
    when and where it was measured (:meth:`context`).

    With ``watch_code`` the commit is read at the start and the context says whether the
    code changed during the run; without, it is read at the end.
    """

    def __init__(self, script: Path, log_prefix: str, timeout_s: float, startup_retries: int,
                 *, watch_code: bool = True) -> None:
        self.script = script
        self.timeout_s = timeout_s
        self.startup_retries = startup_retries
        self.log_dir = Path(tempfile.mkdtemp(prefix=log_prefix))
        self.clock = timed()
        self.machine_before = machine()
        self.code_before = code_revision() if watch_code else None

    def run(self, kind: str, seed: int, options: list[str]) -> Record:
        return run_worker(kind, seed, options, self.timeout_s, self.log_dir,
                          self.startup_retries, self.script)

    def context(self) -> Record:
        """``code``, ``machine_before``, ``machine_after``, ``total_s`` and ``logs``."""
        if self.code_before is None:
            code = code_revision()
        else:
            code = {**self.code_before,
                    "changed_during_run": code_revision() != self.code_before}
        return {"code": code, "machine_before": self.machine_before,
                "machine_after": machine(), "total_s": round(self.clock.s, 1),
                "logs": str(self.log_dir)}


# Inside a worker.


@contextlib.contextmanager
def startup_phase(cleanup: Callable[[], None] | None = None) -> Iterator[None]:
    """Exit with ``EXIT_STARTUP_FAILED`` if Ray or the cluster does not come up, so that
    the parent can start the run again (on a loaded machine Ray's own start-up deadlines,
    such as the raylet's wait for its agents, can pass). The parent kills what is left of
    the process tree."""
    try:
        yield
    except Exception:
        traceback.print_exc()
        if cleanup is not None:
            cleanup()
        sys.stdout.flush()
        os._exit(EXIT_STARTUP_FAILED)


def process_age_s() -> float:
    return time.time() - psutil.Process().create_time()


def processes_outside_tree(pids: set[int]) -> list[int]:
    """Which of ``pids`` are not this process or one of its descendants."""
    me = psutil.Process()
    tree = {me.pid} | {p.pid for p in me.children(recursive=True)}
    alive = {pid for pid in pids if psutil.pid_exists(pid)}
    return sorted(alive - tree)


def ray_session_pids(temp_dir: str) -> set[int]:
    """Processes whose command line names a Ray session directory under ``temp_dir``."""
    found = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if temp_dir in " ".join(proc.info["cmdline"] or ()):
                found.add(proc.info["pid"])
    return found


@contextlib.contextmanager
def private_ray(num_cpus: int) -> Iterator[tuple[str, float]]:
    """A Ray instance of this process alone; yields its temp dir and the seconds it took
    to start. ``"local"`` always starts a new instance (never RAY_ADDRESS or a running
    cluster); the private temp dir keeps it out of /tmp/ray, where other clusters'
    sessions live."""
    import ray

    temp_dir = tempfile.mkdtemp(prefix="bench-rllib-")
    clock = timed()
    with startup_phase(lambda: shutil.rmtree(temp_dir, ignore_errors=True)):
        ray.init(address="local", include_dashboard=False, num_cpus=num_cpus,
                 _temp_dir=temp_dir, log_to_driver=False, logging_level="WARNING")
    try:
        yield temp_dir, clock.s
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


@dataclasses.dataclass
class RLlibAlgorithm:
    """An algorithm built in a :func:`private_ray`; cold start is ``ray.init`` + build."""

    algo: Any
    temp_dir: str
    ray_init_s: float
    cold_start_s: float

    def processes_outside_tree(self) -> list[int]:
        """Processes of its Ray session that are not in this process's tree."""
        return processes_outside_tree(ray_session_pids(self.temp_dir))


@contextlib.contextmanager
def rllib_algorithm(config: Any, num_cpus: int) -> Iterator[RLlibAlgorithm]:
    """``config.build_algo()`` on a :func:`private_ray` of ``num_cpus`` CPUs, stopped at
    the end of the block."""
    with private_ray(num_cpus) as (temp_dir, ray_init_s):
        with timed() as build:
            algo = config.build_algo()
        try:
            yield RLlibAlgorithm(algo, temp_dir, ray_init_s, ray_init_s + build.s)
        finally:
            algo.stop()


def episode_returns_callback() -> type:
    """An RLlib callback that logs every finished episode's whole return under
    ``EPISODE_RETURNS_KEY``, so the driver sees each one (read with
    :func:`episode_returns`). Made in a function so that Ray ships the class to the env
    runners by value (this module is not importable there)."""
    from ray.rllib.callbacks.callbacks import RLlibCallback

    class EpisodeReturns(RLlibCallback):
        def on_episode_end(self, *, episode: Any, metrics_logger: Any = None,
                           prev_episode_chunks: Any = (), **kwargs: Any) -> None:
            # ``episode`` is only the episode's last chunk: one longer than a rollout
            # fragment was cut, and its earlier chunks come beside it.
            whole = episode.get_return() + sum(c.get_return() for c in prev_episode_chunks)
            metrics_logger.log_value(EPISODE_RETURNS_KEY, float(whole), reduce="item_series")

    return EpisodeReturns


def episode_returns(runner_results: dict) -> list[float]:
    returns = runner_results.get(EPISODE_RETURNS_KEY)
    return [float(r) for r in returns] if isinstance(returns, list) else []


@dataclasses.dataclass
class SimulatedSlice:
    """A simulated cluster of this process's own and the slice reserved on it."""

    cluster: Any
    tpu_slice: Any
    cluster_start_s: float
    reserve_s: float


@contextlib.contextmanager
def simulated_slice(read_chips: bool = True) -> Iterator[SimulatedSlice]:
    """A simulated v6e 2x2 started under :func:`startup_phase` and the whole slice reserved
    on it, two CPUs per chip (with ``read_chips``, the reservation's time includes reading
    where its chips are); the cluster is shut down at the end of the block."""
    import workbench as wb

    with timed() as start, startup_phase():
        cluster = wb.local_cluster([("v6e", "2x2")])
    try:
        reserve = timed()
        with wb.reserve("v6e", "2x2", timeout_s=60, cpus_per_chip=2) as tpu_slice:
            if read_chips:
                _ = tpu_slice.chips
            yield SimulatedSlice(cluster, tpu_slice, start.s, reserve.s)
    finally:
        cluster.shutdown()


def single_process_run(slice_config: Any, chips: int = SIMULATED_CHIPS) -> Record:
    """``slice_config``'s run in this one process, no Ray
    (:func:`~workbench.engine.in_process.train_in_process`): one CPU device learns from
    every env of the ``chips`` chips (the same global batch and hyperparameters)."""
    from workbench.learn.platform import configure_jax_platform

    configure_jax_platform("cpu")
    from workbench.engine.in_process import train_in_process

    imports_s = process_age_s()
    done = train_in_process(slice_config, chips=chips)
    return {
        "side": "single",
        "imports_s": round(imports_s, 3),
        "cold_start_s": round(done.startup_s, 3),
        "loop_s": round(done.loop_s, 3),
        "env_steps": done.env_steps,
        "updates": len(done.curve),
        "env_steps_per_s": round(done.env_steps_per_s, 1),
        "time_to_train_target_s": round_or_none(done.time_to_train_target_s),
        "env_steps_to_train_target": None if done.train_target is None
        else done.train_target["env_steps"],
        "mean_return_100": done.curve[-1].get("mean_return_100") if done.curve else None,
        "final_return": done.final_return,
    }


# Where and on what a result was measured.


def code_revision() -> Record:
    """The commit the workbench was measured at, and whether its files differ from it."""

    def git(*argv: str) -> str:
        try:
            done = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True,
                                  timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return done.stdout.strip()

    return {"commit": git("rev-parse", "HEAD") or None,
            "workbench_modified": bool(git("status", "--porcelain", "--", "workbench"))}


def machine() -> Record:
    load = os.getloadavg()
    return {"cpus": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "load_avg_1_5_15": [round(x, 2) for x in load], "python": sys.version.split()[0]}


# Command line and output.


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` as ``[0, 1, 2]``."""
    return [int(s) for s in text.split(",") if s.strip()]


def parse_names(text: str, known: Sequence[str] | dict[str, Any], option: str) -> list[str]:
    """``"a,b"`` as ``["a", "b"]``; exits, naming ``option``, when one is not ``known``."""
    names = [n for n in text.split(",") if n]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise SystemExit(f"unknown {option} {unknown}; choose from {', '.join(known)}")
    return names


def add_run_arguments(parser: argparse.ArgumentParser, worker_timeout_s: float = 3600.0
                      ) -> None:
    """``--seeds``, ``--worker-timeout-s`` and ``--startup-retries``, for a benchmark that
    runs each side's seeds in subprocesses."""
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--worker-timeout-s", type=float, default=worker_timeout_s,
                        help="deadline for one side's run of one seed")
    parser.add_argument("--startup-retries", type=int, default=2,
                        help="new tries for a run whose Ray instance or cluster did not come up")


def add_worker_arguments(parser: argparse.ArgumentParser, kinds: Sequence[str]) -> None:
    """The hidden ``--worker KIND``, ``--seed`` and ``--out`` a subprocess is run with."""
    parser.add_argument("--worker", choices=tuple(kinds), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)


def benchmark_parser(doc: str | None, kinds: Sequence[str], worker_timeout_s: float = 3600.0
                     ) -> argparse.ArgumentParser:
    """The command line of a benchmark that runs its sides in subprocesses of itself: its
    docstring as the description, :func:`add_run_arguments` and the hidden
    :func:`add_worker_arguments`."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser, worker_timeout_s)
    add_worker_arguments(parser, kinds)
    return parser


def run_or_work(args: argparse.Namespace, benchmark: Callable[[argparse.Namespace], Record],
                work: Callable[[argparse.Namespace], Record],
                default: Callable[[Any], Any] | None = None) -> None:
    """Without ``--worker``, run the whole benchmark and print its result; with it, run
    that one side (``work``) and write its record to ``--out``."""
    if args.worker is None:
        print_result(benchmark(args), default=default)
    else:
        write_record(args.out, work(args), default=default)


def print_result(result: Record, indent: int = 1,
                 default: Callable[[Any], Any] | None = None) -> None:
    """The benchmark's one JSON object on stdout."""
    print(json.dumps(result, indent=indent, default=default))


def write_record(path: str | Path, record: Record,
                 default: Callable[[Any], Any] | None = None) -> None:
    """A worker's record, for the parent (:func:`run_worker`) to read."""
    Path(path).write_text(json.dumps(record, default=default))
