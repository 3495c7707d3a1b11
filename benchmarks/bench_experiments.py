"""Experiments on a simulated v6e 2x2: a sweep of many seeds in one program against one
seed and against seeds run one after another; tracking on against off; a served policy
against a plain in-process forward of the same policy.

Prints one JSON object. Every peer runs in the same invocation on the same cluster.

    .venv/bin/python benchmarks/bench_experiments.py --seeds 64 --sequential 3 --repeats 3

``--sequential N`` runs N seeds as separate ``workbench train`` commands against the
benchmark's running cluster (what a user does today without sweeps); with N below
``--seeds`` the time for all seeds is that median run times the seed count, and the
record says it is an estimate.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import harness
import numpy as np

import workbench as wb
from workbench.engine import TrainConfig, train
from workbench.engine.serving import serve_policy
from workbench.engine.sweep import sweep

WORKBENCH = str(Path(sys.executable).with_name("workbench"))


def _cartpole(total_env_steps: int, **fields) -> TrainConfig:
    return TrainConfig(env="workbench/CartPole-v1", mode="anakin",
                       total_env_steps=total_env_steps, eval_every=0, **fields)


def measure_sweeps(tpu_slice, seeds: int, total_env_steps: int) -> dict:
    """One seed, then ``seeds`` seeds, each as one sweep on ``tpu_slice``."""
    timings = {}
    results = {}
    for count in (1, seeds):
        with harness.timed() as clock:
            results[count] = sweep(tpu_slice, _cartpole(total_env_steps), seeds=count)
        timings[count] = clock.s
    many = results[seeds]
    return {
        "env_steps_per_trial": total_env_steps,
        "one_seed_s": round(timings[1], 2),
        "one_seed_reached_target": results[1].trials[0]["time_to_train_target_s"] is not None,
        f"{seeds}_seeds_s": round(timings[seeds], 2),
        f"{seeds}_seeds_vs_one_ratio": round(timings[seeds] / timings[1], 2),
        f"{seeds}_seeds_reached_target": sum(t["time_to_train_target_s"] is not None
                                             for t in many.trials),
        "final_return_iqm": many.configs[0]["final_return"]["iqm"],
    }


def measure_one_by_one(address: str, seeds: int, total_env_steps: int, sequential: int,
                       swept_s: float) -> dict:
    """The peer: ``sequential`` seeds as separate CLI runs on the same running cluster
    (what a user does without sweeps); fewer than ``seeds`` gives an estimate for all."""
    one_by_one = []
    with tempfile.TemporaryDirectory() as scratch:
        for seed in range(sequential):
            with harness.timed() as clock:
                subprocess.run([WORKBENCH, "train", "--address", address, "--mode", "anakin",
                                "--env", "workbench/CartPole-v1", "--total-env-steps",
                                str(total_env_steps), "--eval-every", "0", "--seed",
                                str(seed), "--json", f"{scratch}/{seed}.json"], check=True,
                               capture_output=True, timeout=900)
            one_by_one.append(clock.s)
    total = (sum(one_by_one) if sequential >= seeds
             else harness.median(one_by_one, digits=None, scale=seeds))
    return {
        "sequential_runs_measured": sequential,
        "sequential_run_median_s": harness.median(one_by_one),
        f"sequential_{seeds}_seeds_s": round(total, 1),
        "sequential_is_estimate": sequential < seeds,
        "sweep_speedup_vs_sequential": round(total / swept_s, 1),
    }


def measure_tracking(tpu_slice, total_env_steps: int, repeats: int, runs: Path) -> dict:
    rates: dict[str, list[float]] = {"off": [], "tensorboard": [], "mlflow": []}
    for repeat in range(repeats):
        for backend in rates:
            config = _cartpole(total_env_steps, seed=repeat,
                               track=None if backend == "off" else backend,
                               run_dir=str(runs / f"{backend}-{repeat}"))
            rates[backend].append(train(tpu_slice, config).env_steps_per_s)
    return {
        "env_steps_per_trial": total_env_steps,
        **{f"{name}_env_steps_per_s_median": harness.median(values)
           for name, values in rates.items()},
        **{f"{name}_vs_off_ratio": harness.median_ratio(rates[name], rates["off"])
           for name in ("tensorboard", "mlflow")},
    }


def _post(url: str, payload: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def _per_s(seconds: list[float]) -> float | None:
    """Calls per second at the median call's time."""
    return harness.ratio(1, harness.median(seconds, digits=None), 1)


def measure_serving(run_dir: str, requests: int) -> dict:
    import jax

    policy = wb.load(run_dir)
    act = policy.greedy_policy()
    # The peer for a batch: the same greedy forward, jitted over 64 observations at once.
    greedy, params = policy.agent.build().greedy, policy.params
    act_batch = jax.jit(lambda batch: greedy(params, batch))
    rng = np.random.default_rng(0)
    singles = rng.normal(0, 0.1, size=(requests, 4)).astype(np.float32)
    batches = rng.normal(0, 0.1, size=(max(requests // 10, 5), 64, 4)).astype(np.float32)

    def seconds_each(call, items) -> list[float]:
        np.asarray(call(items[0]))  # warm: compiled, connected
        seconds = []
        for item in items:
            with harness.timed() as clock:
                np.asarray(call(item))  # the answer on the host, as a served one is
            seconds.append(clock.s)
        return seconds

    peer_single = seconds_each(act, singles)
    peer_batch = seconds_each(lambda b: np.asarray(act_batch(b)), batches)
    with serve_policy(run_dir, max_batch_size=64) as server:
        served_single = seconds_each(lambda o: _post(server.url, {"observation": o.tolist()}),
                                     singles)
        served_batch = seconds_each(lambda b: _post(server.url, {"observations": b.tolist()}),
                                    batches)
    ms = 1000.0
    return {
        "requests": requests,
        "served_single_median_ms": harness.median(served_single, 2, scale=ms),
        "served_single_p99_ms": round(float(np.percentile(served_single, 99)) * ms, 2),
        "served_batch64_requests_per_s": _per_s(served_batch),
        "peer_in_process_single_median_ms": harness.median(peer_single, 3, scale=ms),
        "peer_in_process_batch64_calls_per_s": _per_s(peer_batch),
        "served_vs_peer_single_latency_ratio": harness.median_ratio(served_single,
                                                                    peer_single, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=64)
    parser.add_argument("--total-env-steps", type=int, default=300_000)
    parser.add_argument("--sequential", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--parts", default="sweep,tracking,serving",
                        help="which parts to run, comma-separated")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    record = {"benchmark": "experiments", "slice": "v6e 2x2 (simulated)", "env":
              "workbench/CartPole-v1", "mode": "anakin"}
    with tempfile.TemporaryDirectory() as scratch, wb.local_cluster([("v6e", "2x2")]) as cluster:
        runs = Path(scratch)
        if "sweep" in parts:
            tpu_slice = wb.reserve("v6e", "2x2", timeout_s=60)
            record["sweep"] = _partial("sweep", measure_sweeps(tpu_slice, args.seeds,
                                                               args.total_env_steps))
            tpu_slice.release()
            record["sweep"].update(_partial("one_by_one", measure_one_by_one(
                cluster.address, args.seeds, args.total_env_steps, args.sequential,
                record["sweep"][f"{args.seeds}_seeds_s"])))
        with wb.reserve("v6e", "2x2", timeout_s=60) as tpu_slice:
            if "tracking" in parts:
                record["tracking"] = _partial("tracking", measure_tracking(
                    tpu_slice, args.total_env_steps, args.repeats, runs))
            else:  # the served policy still needs a trained run
                train(tpu_slice, _cartpole(args.total_env_steps, run_dir=str(runs / "off-0")))
        if "serving" in parts:
            record["serving"] = measure_serving(str(runs / "off-0"), args.requests)
    harness.print_result(record)


def _partial(part: str, figures: dict) -> dict:
    """Each part's figures go to stderr as soon as they exist: a long invocation that is
    cut short still leaves what it measured."""
    print(json.dumps({"part": part, **figures}), file=sys.stderr, flush=True)
    return figures


if __name__ == "__main__":
    main()
