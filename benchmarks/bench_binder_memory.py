"""Does the quickstart fit a Binder session (2 GiB)? Memory of the whole process tree.

Runs ``notebooks/01_quickstart.ipynb`` headless through papermill, starting its own
simulated cluster as it does on Binder, and samples every process under papermill (the
kernel, the simulator, Ray's daemons, every learner and rollout worker) every 0.5 s.
Reports the peak of the summed PSS (shared pages split between the processes sharing
them; the honest total) and of the summed RSS (counts shared pages once per process).

The peer, run in the same invocation and sampled the same way, is a plain kernel that
trains the same PPO (same network, hyperparameters, envs and env steps) in one process
with the workbench's own learner and rollout code, and no Ray: the ratio is the memory
price of the simulated slice.

    .venv/bin/python benchmarks/bench_binder_memory.py
    .venv/bin/python benchmarks/bench_binder_memory.py --total-env-steps 50000

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
import nbformat
import psutil

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "notebooks" / "01_quickstart.ipynb"
OUT = ROOT / "build" / "bench"
LIMIT_BYTES = 2 * 1024**3
MIB = 1024**2

PEER_SOURCE = """
import numpy as np

from workbench.learn.actors_mode import BatchLearner, LocalSource
from workbench.learn.evaluation import GreedyEvaluator
from workbench.learn.rollout import RolloutWorker
from workbench.engine import TrainConfig
from workbench.engine.plan import plan_run

# The quickstart's run on a 2x2 slice: 4 chips' worth of environments, same budget.
config = TrainConfig(env="CartPole-v1", total_env_steps=total_env_steps, seed=seed,
                     envs_per_chip=chips * TrainConfig().envs_per_chip)
setup = plan_run(config).learner_setup(1, "gradients")
worker = RolloutWorker(config.env, config.envs_per_chip, config.rollout_length, setup.agent,
                       seed)
learner = BatchLearner(setup, LocalSource([worker]))
for update in range(config.num_updates(1)):
    learner.step()
evaluator = GreedyEvaluator(config.env, setup.agent, seed)
final_return = float(np.mean(evaluator.evaluate(learner.policy_numpy(), config.eval_episodes)))
print("final greedy return", final_return)
"""


def _label(proc: psutil.Process) -> str:
    """A short name for what a process is (kernel, raylet, a Ray actor...)."""
    try:
        cmdline = proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "?"
    if not cmdline:
        return proc.name()
    first = cmdline[0]
    if first.startswith("ray::"):
        return first.split()[0].split(".")[0]  # the actor class, not the method it runs
    if "-m" in cmdline[:-1]:
        return cmdline[cmdline.index("-m") + 1]
    for arg in cmdline[1:3]:
        if arg.endswith(".py"):
            return os.path.basename(arg)
    return os.path.basename(first)


def _sample(root: psutil.Process) -> tuple[int, int, dict[str, int], int]:
    """Summed PSS and RSS of ``root`` and all its descendants, PSS by label, and how many
    processes were read."""
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0, {}, 0
    pss = rss = count = 0
    by_label: dict[str, int] = {}
    for proc in procs:
        try:
            info = proc.memory_full_info()
            label = _label(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        pss += info.pss
        rss += info.rss
        count += 1
        by_label[label] = by_label.get(label, 0) + info.pss
    return pss, rss, by_label, count


def measure(notebook: Path, output: Path, parameters: dict, interval_s: float) -> dict:
    """Execute ``notebook`` with papermill in a child process and sample its tree."""
    command = [sys.executable, "-m", "papermill", str(notebook), str(output), "-k", "python3",
               "--cwd", str(output.parent), "--no-progress-bar"]
    for key, value in parameters.items():
        command += ["-p", key, str(value)]
    env = harness.child_env()
    clock = harness.timed()
    with open(output.with_suffix(".log"), "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        root = psutil.Process(process.pid)
        peak = {"pss": 0, "rss": 0, "by_label": {}, "processes": 0}
        peak_rss = 0
        samples = 0
        try:
            while process.poll() is None:
                pss, rss, by_label, count = _sample(root)
                samples += 1
                peak_rss = max(peak_rss, rss)
                if pss > peak["pss"]:
                    peak = {"pss": pss, "rss": rss, "by_label": by_label, "processes": count}
                time.sleep(interval_s)
        finally:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=1800)
    if process.returncode != 0:
        raise RuntimeError(
            f"{notebook.name} failed under papermill (exit {process.returncode}); see "
            f"{output.with_suffix('.log')}"
        )
    from workbench.ui import read_records

    by_label = sorted(peak["by_label"].items(), key=lambda kv: -kv[1])
    return {
        "notebook": notebook.name,
        "wall_s": round(clock.s, 1),
        "samples": samples,
        "peak_pss_mib": round(peak["pss"] / MIB, 1),
        "rss_at_peak_pss_mib": round(peak["rss"] / MIB, 1),
        "peak_rss_mib": round(peak_rss / MIB, 1),
        "processes_at_peak": peak["processes"],
        "pss_at_peak_by_process_mib": {k: round(v / MIB, 1) for k, v in by_label},
        "recorded": read_records(output),
    }


def _peer_notebook(directory: Path) -> Path:
    notebook = nbformat.v4.new_notebook()
    parameters = nbformat.v4.new_code_cell("total_env_steps = 100_000\nseed = 0\nchips = 4")
    parameters.metadata["tags"] = ["parameters"]
    notebook.cells = [
        parameters,
        nbformat.v4.new_code_cell(PEER_SOURCE.strip()),
        nbformat.v4.new_code_cell(
            "from workbench import ui\nui.record(final_return=final_return)"
        ),
    ]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    path = directory / "peer_single_process_ppo.ipynb"
    nbformat.write(notebook, path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-env-steps", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--interval-s", type=float, default=0.5)
    parser.add_argument("--topology", default="1x1",
                        help="the quickstart's v6e topology (1x1, as on Binder; 2x2: four "
                             "learner processes)")
    args = parser.parse_args(argv)
    if args.total_env_steps <= 0 or args.interval_s <= 0:
        parser.error("--total-env-steps and --interval-s must be positive")
    OUT.mkdir(parents=True, exist_ok=True)
    quickstart = measure(
        QUICKSTART, OUT / "01_quickstart.ipynb",
        {"total_env_steps": args.total_env_steps, "seed": args.seed, "min_final_return": 0.0,
         "topology": args.topology},
        args.interval_s,
    )
    with tempfile.TemporaryDirectory(prefix="wb-peer-") as directory:
        peer = measure(
            _peer_notebook(Path(directory)), OUT / "peer_single_process_ppo.ipynb",
            {"total_env_steps": args.total_env_steps, "seed": args.seed, "chips": 4},
            args.interval_s,
        )
    over = quickstart["peak_pss_mib"] * MIB - LIMIT_BYTES
    harness.print_result({
        "topology": f"v6e {args.topology}",
        "quickstart": quickstart,
        "peer_single_process": peer,
        "pss_ratio_quickstart_vs_peer": harness.ratio(quickstart["peak_pss_mib"],
                                                      peer["peak_pss_mib"], 2),
        "limit_mib": LIMIT_BYTES // MIB,
        "quickstart_fits_2gib": over <= 0,
        "quickstart_over_2gib_by_mib": round(max(0.0, over / MIB), 1),
        "cpus": os.cpu_count(),
    }, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
