"""PPO on CartPole-v1: the workbench on a simulated v6e 2x2 slice against RLlib's PPO.

Prints one JSON object: a record per seed for each side, medians over seeds, ratios, and
whether the goals are met (workbench time to the training target <= 1/10 of RLlib's,
workbench env-steps/s >= 20x RLlib's, workbench cold start < 20 s).

    .venv/bin/python benchmarks/bench_ppo_vs_rllib.py --seeds 0,1,2

Both sides run in the same invocation on the same machine, one after the other, each in
its own subprocess (this same file, ``--worker rllib|workbench``), so that each is isolated
and the peak RSS of its whole process tree (sampled every 0.5 s, summed over the subprocess
and all its descendants) covers every process it started.

RLlib: ``PPOConfig`` exactly as RLlib's ``examples/algorithms/ppo/cartpole_ppo.py`` (new API
stack, torch, 2 EnvRunners, 4000 env steps per ``train()``), seeded with
``.debugging(seed=...)``, in a private local Ray instance (``ray.init(address="local")`` with
its own temp dir: it never joins another cluster). ``algo.train()`` runs until the training
target or ``--rllib-max-env-steps``.

Targets, the same for both sides:
  training target: mean return of the last 100 training episodes >= 475. For RLlib the
    benchmark keeps those 100 returns itself, from a callback that logs every finished
    episode's return: in Ray 2.60 ``env_runners/episode_return_mean`` is not a 100-episode
    moving window (each EnvRunner's window is reset at every iteration, and the
    EnvRunners' means are averaged), so it is reported beside, never used as the target.
  evaluation target: a 20-episode greedy (argmax) evaluation with mean return >= 475.
    RLlib's is run by this benchmark in the driver with ``algo.get_module()`` every
    ``--rllib-eval-every`` iterations (5: ~20k env steps, the workbench's cadence), and its
    time is excluded from RLlib's training-loop time; the workbench evaluates every 5
    updates on its own actor, concurrently with training.

Times to target are seconds of training loop (RLlib: summed ``train()`` calls; workbench:
from its loop start). Env-steps/s: env steps over those loop seconds. Cold start: RLlib
``ray.init`` + ``build_algo()``; workbench cluster start + reservation + ``startup_s``
(actors, jax.distributed, warm-up compile). Interpreter and import time (RLlib and torch,
or the workbench and JAX) is reported separately as ``imports_s``. ``tree_cpu_s`` is the
CPU time of the whole tree (approximate: a process's last 0.5 s before it exits is missed),
a figure that, unlike the times, does not grow when other work shares the machine.

Medians over seeds treat a target never reached as slower than any reached one; a median
that lands there is ``null``. The time-to-target ratios come with bounds: a run that never
got there took longer than its whole loop, so a goal can still be decided (``met``) when a
side ran out of budget; ``met`` is ``null`` only when the bounds leave it open.

A run whose Ray instance or simulated cluster fails to come up (on a loaded 2-core machine
Ray's own start-up deadlines can pass) is started again, ``--startup-retries`` times at
most; ``startup_attempts`` and ``failed_startup_s`` say so, and the figures are those of
the attempt that came up.
"""

from __future__ import annotations

import argparse
import contextlib
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
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

TARGET_RETURN = 475.0
WINDOW = 100
EVAL_EPISODES = 20
EVAL_SEED_OFFSET = 999_983
EPISODE_RETURNS_KEY = "bench_episode_returns"
EXIT_STARTUP_FAILED = 75
GOAL_TRAIN_TARGET_SPEEDUP = 10.0
GOAL_THROUGHPUT_RATIO = 20.0
GOAL_WORKBENCH_COLD_START_S = 20.0

Record = dict[str, Any]


# Measuring a process tree from the parent.


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


def worker_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return env


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
               startup_retries: int, script: Path | None = None) -> Record:
    """Run one side for one seed in a subprocess; its record plus process-tree figures.

    A run whose Ray instance or cluster failed to come up is started again from scratch,
    at most ``startup_retries`` times; the count is in the record.
    """
    out = log_dir / f"{kind}-seed{seed}.json"
    command = [sys.executable, str(script or Path(__file__).resolve()), "--worker", kind,
               "--seed", str(seed), "--out", str(out), *options]
    out.unlink(missing_ok=True)  # an earlier pair's record must not stand in for this run
    failed_startup_s = 0.0
    for attempt in range(1, startup_retries + 2):
        log_path = log_dir / f"{kind}-seed{seed}-attempt{attempt}.log"
        started = time.monotonic()
        returncode, sampler, leftovers = run_attempt(command, timeout_s, log_path)
        if returncode != EXIT_STARTUP_FAILED:
            break
        failed_startup_s += time.monotonic() - started
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


# Shared by both workers.


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


def _field(point: Record | None, key: str) -> Any:
    return None if point is None else point[key]


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


# RLlib worker.


def episode_returns_callback() -> type:
    """An RLlib callback that logs every finished episode's whole return under
    ``EPISODE_RETURNS_KEY``, so the driver sees each one (read with
    :func:`episode_returns`). Made in a function so that Ray ships the class to the env
    runners by value (this file is not importable there)."""
    from ray.rllib.callbacks.callbacks import RLlibCallback

    class EpisodeReturns(RLlibCallback):
        def on_episode_end(self, *, episode: Any, metrics_logger: Any = None,
                           prev_episode_chunks: Any = (), **kwargs: Any) -> None:
            # ``episode`` is only the episode's last chunk: one longer than a rollout
            # fragment was cut, and its earlier chunks come beside it.
            whole = episode.get_return() + sum(c.get_return() for c in prev_episode_chunks)
            metrics_logger.log_value(EPISODE_RETURNS_KEY, float(whole), reduce="item_series")

    return EpisodeReturns


def rllib_config(seed: int) -> Any:
    """RLlib's tuned CartPole PPO (examples/algorithms/ppo/cartpole_ppo.py), seeded."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    return (
        PPOConfig()
        .environment("CartPole-v1")
        .framework("torch")
        .training(lr=0.0003, num_epochs=6, vf_loss_coeff=0.01)
        .rl_module(
            model_config=DefaultModelConfig(
                fcnet_hiddens=[32], fcnet_activation="linear", vf_share_layers=True
            )
        )
        .callbacks(episode_returns_callback())
        .debugging(seed=seed)
    )


def greedy_eval(module: Any, episodes: int, seed: int) -> float:
    """Mean return of ``episodes`` CartPole episodes with argmax actions, stepped together."""
    import gymnasium as gym
    import numpy as np
    import torch

    envs = [gym.make("CartPole-v1") for _ in range(episodes)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    returns = np.zeros(episodes)
    active = np.ones(episodes, dtype=bool)
    with torch.no_grad():
        while active.any():
            idx = np.flatnonzero(active)
            batch = {"obs": torch.as_tensor(obs[idx], dtype=torch.float32)}
            actions = module.forward_inference(batch)["action_dist_inputs"].argmax(-1).numpy()
            for i, action in zip(idx, actions, strict=True):
                obs[i], reward, terminated, truncated, _ = envs[i].step(int(action))
                returns[i] += reward
                active[i] = not (terminated or truncated)
    for env in envs:
        env.close()
    return float(returns.mean())


def episode_returns(runner_results: dict) -> list[float]:
    returns = runner_results.get(EPISODE_RETURNS_KEY)
    return [float(r) for r in returns] if isinstance(returns, list) else []


def rllib_loop(algo: Any, seed: int, max_env_steps: int, eval_every: int) -> Record:
    """``algo.train()`` until the training target or the budget; evaluations excluded."""
    from ray.rllib.utils.metrics import (
        ENV_RUNNER_RESULTS,
        EPISODE_RETURN_MEAN,
        NUM_ENV_STEPS_SAMPLED_LIFETIME,
    )

    recent: deque[float] = deque(maxlen=WINDOW)
    loop_s = eval_s = 0.0
    env_steps = iteration = episodes = 0
    train_hit = eval_hit = key_hit = None
    curve = []
    while env_steps < max_env_steps and train_hit is None:
        started = time.perf_counter()
        result = algo.train()
        loop_s += time.perf_counter() - started
        iteration += 1
        runners = result[ENV_RUNNER_RESULTS]
        env_steps = int(runners[NUM_ENV_STEPS_SAMPLED_LIFETIME])
        finished = episode_returns(runners)
        recent.extend(finished)
        episodes += len(finished)
        mean_100 = sum(recent) / WINDOW if len(recent) == WINDOW else None
        reported = runners.get(EPISODE_RETURN_MEAN)
        reported = None if reported is None or math.isnan(reported) else float(reported)
        point = {"iteration": iteration, "loop_s": round(loop_s, 3), "env_steps": env_steps}
        if train_hit is None and mean_100 is not None and mean_100 >= TARGET_RETURN:
            train_hit = point
        if key_hit is None and reported is not None and reported >= TARGET_RETURN:
            key_hit = point
        eval_return = None
        if eval_every and iteration % eval_every == 0:
            started = time.perf_counter()
            eval_return = greedy_eval(algo.get_module(), EVAL_EPISODES,
                                      seed + EVAL_SEED_OFFSET)
            eval_s += time.perf_counter() - started
            if eval_hit is None and eval_return >= TARGET_RETURN:
                eval_hit = point
        curve.append({**point, "episodes": episodes, "episodes_this_iteration": len(finished),
                      "mean_return_100": _round(mean_100, 2),
                      "rllib_episode_return_mean": _round(reported, 2),
                      "eval_return": eval_return})
    started = time.perf_counter()
    final_return = greedy_eval(algo.get_module(), EVAL_EPISODES, seed + EVAL_SEED_OFFSET)
    eval_s += time.perf_counter() - started
    return {
        "env_steps": env_steps,
        "iterations": iteration,
        "episodes": episodes,
        "loop_s": round(loop_s, 3),
        "eval_s_excluded": round(eval_s, 3),
        "env_steps_per_s": round(env_steps / loop_s, 1) if loop_s > 0 else None,
        "time_to_train_target_s": _field(train_hit, "loop_s"),
        "env_steps_to_train_target": _field(train_hit, "env_steps"),
        "time_to_eval_target_s": _field(eval_hit, "loop_s"),
        "env_steps_to_eval_target": _field(eval_hit, "env_steps"),
        "rllib_episode_return_mean_time_to_target_s": _field(key_hit, "loop_s"),
        "rllib_episode_return_mean_env_steps_to_target": _field(key_hit, "env_steps"),
        "final_return": final_return,
        "curve": curve,
    }


@contextlib.contextmanager
def private_ray(num_cpus: int) -> Iterator[tuple[str, float]]:
    """A Ray instance of this process alone; yields its temp dir and the seconds it took
    to start. ``"local"`` always starts a new instance (never RAY_ADDRESS or a running
    cluster); the private temp dir keeps it out of /tmp/ray, where other clusters'
    sessions live."""
    import ray

    temp_dir = tempfile.mkdtemp(prefix="bench-rllib-")
    started = time.monotonic()
    with startup_phase(lambda: shutil.rmtree(temp_dir, ignore_errors=True)):
        ray.init(address="local", include_dashboard=False, num_cpus=num_cpus,
                 _temp_dir=temp_dir, log_to_driver=False, logging_level="WARNING")
    try:
        yield temp_dir, time.monotonic() - started
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def rllib_worker(seed: int, max_env_steps: int, eval_every: int) -> Record:
    import ray

    config = rllib_config(seed)  # imports RLlib and torch before the clock starts
    imports_s = process_age_s()
    with private_ray(num_cpus=2) as (temp_dir, ray_init_s):
        started = time.monotonic()
        algo = config.build_algo()
        cold_start_s = ray_init_s + time.monotonic() - started
        try:
            outside = processes_outside_tree(ray_session_pids(temp_dir))
            record = rllib_loop(algo, seed, max_env_steps, eval_every)
            outside += processes_outside_tree(ray_session_pids(temp_dir))
        finally:
            algo.stop()
    return {
        "side": "rllib",
        "ray_version": ray.__version__,
        "imports_s": round(imports_s, 3),
        "ray_init_s": round(ray_init_s, 3),
        "build_s": round(cold_start_s - ray_init_s, 3),
        "cold_start_s": round(cold_start_s, 3),
        "cold_start_with_imports_s": round(imports_s + cold_start_s, 3),
        "ray_processes_outside_tree": sorted(set(outside)),
        **record,
    }


# Workbench worker.


def workbench_worker(seed: int, total_env_steps: int, mode: str = "actors",
                     env: str = "CartPole-v1") -> Record:
    import workbench as wb
    from workbench.engine import TrainConfig, train

    imports_s = process_age_s()
    code = code_revision()
    started = time.monotonic()
    with startup_phase():
        cluster = wb.local_cluster([("v6e", "2x2")])
    cluster_start_s = time.monotonic() - started
    outside: set[int] = set()

    def check_tree(_row: dict) -> None:
        if not outside:
            outside.update(processes_outside_tree(cluster.process_ids()))

    try:
        started = time.monotonic()
        with wb.reserve("v6e", "2x2", timeout_s=60, cpus_per_chip=2) as tpu_slice:
            _ = tpu_slice.chips
            reserve_s = time.monotonic() - started
            config = TrainConfig(env=env, mode=mode, total_env_steps=total_env_steps,
                                 seed=seed, stop_at_target=True)
            result = train(tpu_slice, config, on_update=check_tree)
            outside.update(processes_outside_tree(cluster.process_ids()))
    finally:
        cluster.shutdown()
    record = result.to_json()
    curve = record.pop("curve")
    cold_start_s = cluster_start_s + reserve_s + result.startup_s
    return {
        "side": "workbench",
        "commit": code["commit"],
        "workbench_modified": code["workbench_modified"],
        "imports_s": round(imports_s, 3),
        "cluster_start_s": round(cluster_start_s, 3),
        "reserve_s": round(reserve_s, 3),
        "cold_start_s": round(cold_start_s, 3),
        "cold_start_with_imports_s": round(imports_s + cold_start_s, 3),
        "cluster_processes_outside_tree": sorted(outside),
        "loop_s": result.wall_s,
        **record,
        "curve": [
            {k: row.get(k) for k in ("update", "env_steps", "mean_return_100",
                                     "mean_return_this_update")}
            for row in curve
        ],
    }


# Summary.


def _finite_or_none(value: float, digits: int = 3) -> float | None:
    return None if math.isinf(value) or math.isnan(value) else round(value, digits)


def median_or_none(values: list[float | None], lower_is_better: bool = True) -> float | None:
    """Median over seeds where ``None`` (never reached) counts as the worst value."""
    worst = math.inf if lower_is_better else -math.inf
    return _finite_or_none(statistics.median([worst if v is None else v for v in values]))


def median_time_bounds(records: list[Record], key: str) -> tuple[float, float]:
    """Bounds on the median time to a target over seeds.

    A run that never reached it took longer than its whole training loop (``loop_s``), and
    than any time at all: the median of those stand-ins is a lower bound, the median with
    infinity in their place an upper bound. Both equal the median when every run got there.
    """
    spent = [r[key] if r.get(key) is not None else r.get("loop_s") or 0.0 for r in records]
    never = [r[key] if r.get(key) is not None else math.inf for r in records]
    return statistics.median(spent), statistics.median(never)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    return round(numerator / denominator, 3)


def time_ratio_bounds(rllib: list[Record], workbench: list[Record], key: str
                      ) -> tuple[float, float]:
    """Bounds on (RLlib's median time to a target) / (the workbench's)."""
    rl_low, rl_high = median_time_bounds(rllib, key)
    wb_low, wb_high = median_time_bounds(workbench, key)
    low = rl_low / wb_high if wb_high > 0 else math.inf
    high = rl_high / wb_low if wb_low > 0 else math.inf
    return low, high


def speedup_goal(rllib: list[Record], workbench: list[Record], key: str, need: float) -> Record:
    """Met when even the lower bound of the ratio reaches ``need``; not met when even the
    upper bound falls short; ``None`` when a target never reached leaves it open."""
    low, high = time_ratio_bounds(rllib, workbench, key)
    met = True if low >= need else False if high < need else None
    return {"ratio_bounds": [_finite_or_none(low), _finite_or_none(high)], "need": need,
            "met": met}


def at_least(value: float | None, bound: float) -> bool | None:
    return None if value is None else value >= bound


TIME_FIGURES = ("time_to_train_target_s", "env_steps_to_train_target", "time_to_eval_target_s",
                "cold_start_s", "cold_start_with_imports_s", "imports_s", "peak_rss_mib",
                "tree_cpu_s")


def medians(records: list[Record]) -> Record:
    figures = {k: median_or_none([r.get(k) for r in records]) for k in TIME_FIGURES}
    figures["env_steps_per_s"] = median_or_none([r.get("env_steps_per_s") for r in records],
                                                lower_is_better=False)
    figures["train_target_reached"] = (
        f"{sum(r.get('time_to_train_target_s') is not None for r in records)}/{len(records)}"
    )
    figures["eval_target_reached"] = (
        f"{sum(r.get('time_to_eval_target_s') is not None for r in records)}/{len(records)}"
    )
    return figures


def summarize(rllib: list[Record], workbench: list[Record]) -> Record:
    rl, wb = medians(rllib), medians(workbench)
    train_goal = speedup_goal(rllib, workbench, "time_to_train_target_s",
                              GOAL_TRAIN_TARGET_SPEEDUP)
    eval_low, eval_high = time_ratio_bounds(rllib, workbench, "time_to_eval_target_s")
    ratios = {
        "time_to_train_target_rllib_over_workbench": ratio(rl["time_to_train_target_s"],
                                                           wb["time_to_train_target_s"]),
        "time_to_train_target_rllib_over_workbench_bounds": train_goal["ratio_bounds"],
        "time_to_eval_target_rllib_over_workbench": ratio(rl["time_to_eval_target_s"],
                                                          wb["time_to_eval_target_s"]),
        "time_to_eval_target_rllib_over_workbench_bounds": [_finite_or_none(eval_low),
                                                            _finite_or_none(eval_high)],
        "env_steps_to_train_target_rllib_over_workbench": ratio(
            rl["env_steps_to_train_target"], wb["env_steps_to_train_target"]),
        "env_steps_per_s_workbench_over_rllib": ratio(wb["env_steps_per_s"],
                                                      rl["env_steps_per_s"]),
        "cold_start_rllib_over_workbench": ratio(rl["cold_start_s"], wb["cold_start_s"]),
        "cold_start_workbench_over_rllib": ratio(wb["cold_start_s"], rl["cold_start_s"]),
        "peak_rss_workbench_over_rllib": ratio(wb["peak_rss_mib"], rl["peak_rss_mib"]),
    }
    throughput = ratios["env_steps_per_s_workbench_over_rllib"]
    cold = wb["cold_start_s"]
    goals = {
        "time_to_train_target_at_most_1_10_of_rllib": {
            "ratio": ratios["time_to_train_target_rllib_over_workbench"], **train_goal,
        },
        "env_steps_per_s_at_least_20x_rllib": {
            "ratio": throughput, "need": GOAL_THROUGHPUT_RATIO,
            "met": at_least(throughput, GOAL_THROUGHPUT_RATIO),
        },
        "workbench_cold_start_under_20_s": {
            "value_s": cold, "need_below_s": GOAL_WORKBENCH_COLD_START_S,
            "met": None if cold is None else cold < GOAL_WORKBENCH_COLD_START_S,
        },
    }
    return {"median": {"rllib": rl, "workbench": wb}, "ratios": ratios, "goals": goals}


def code_revision() -> Record:
    """The commit the workbench was measured at, and whether its files differ from it."""
    root = Path(__file__).resolve().parent.parent

    def git(*argv: str) -> str:
        try:
            done = subprocess.run(["git", *argv], cwd=root, capture_output=True, text=True,
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


def run_benchmark(args: argparse.Namespace) -> Record:
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    log_dir = Path(tempfile.mkdtemp(prefix="bench-ppo-vs-rllib-"))
    started = time.monotonic()
    load_before, code_before = machine(), code_revision()
    rllib, workbench = [], []
    for seed in seeds:
        rllib.append(run_worker(
            "rllib", seed,
            ["--rllib-max-env-steps", str(args.rllib_max_env_steps),
             "--rllib-eval-every", str(args.rllib_eval_every)],
            args.worker_timeout_s, log_dir, args.startup_retries))
        workbench.append(run_worker(
            "workbench", seed, ["--workbench-env-steps", str(args.workbench_env_steps)],
            args.worker_timeout_s, log_dir, args.startup_retries))
    if not args.keep_curves:
        for record in rllib + workbench:
            record.pop("curve", None)
    return {
        "benchmark": "ppo_vs_rllib",
        "env": "CartPole-v1",
        "target_return": TARGET_RETURN,
        "train_target": f"mean return of the last {WINDOW} training episodes >= "
                        f"{TARGET_RETURN:g}",
        "eval_target": f"{EVAL_EPISODES}-episode greedy evaluation mean >= {TARGET_RETURN:g}",
        "seeds": seeds,
        "rllib_max_env_steps": args.rllib_max_env_steps,
        "rllib_eval_every_iterations": args.rllib_eval_every,
        "workbench_env_steps": args.workbench_env_steps,
        "code": {**code_before, "changed_during_run": code_revision() != code_before},
        "machine_before": load_before,
        "machine_after": machine(),
        "total_s": round(time.monotonic() - started, 1),
        "logs": str(log_dir),
        **summarize(rllib, workbench),
        "rllib": rllib,
        "workbench": workbench,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--rllib-max-env-steps", type=int, default=300_000)
    parser.add_argument("--rllib-eval-every", type=int, default=5,
                        help="RLlib iterations (4000 env steps each) between evaluations")
    parser.add_argument("--workbench-env-steps", type=int, default=500_000,
                        help="the workbench's total_env_steps budget")
    parser.add_argument("--worker-timeout-s", type=float, default=3600.0,
                        help="deadline for one side's run of one seed")
    parser.add_argument("--startup-retries", type=int, default=2,
                        help="new tries for a run whose Ray instance or cluster did not come up")
    parser.add_argument("--keep-curves", action="store_true",
                        help="keep each run's per-iteration/per-update curve in the output")
    parser.add_argument("--worker", choices=("rllib", "workbench"), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "rllib":
        record = rllib_worker(args.seed, args.rllib_max_env_steps, args.rllib_eval_every)
    elif args.worker == "workbench":
        record = workbench_worker(args.seed, args.workbench_env_steps)
    else:
        print(json.dumps(run_benchmark(args), indent=1))
        return
    Path(args.out).write_text(json.dumps(record))


if __name__ == "__main__":
    main()
