"""What the simulated slice costs, every figure beside its peer, in one invocation.

    .venv/bin/python benchmarks/bench_slice_overhead.py --readme

Runs the benchmarks below one after another (each in its own processes, on the same
machine), prints one JSON object with their records and a summary, and with ``--readme``
rewrites the README's table between the ``bench_slice_overhead`` markers from it:

  cold     a fresh simulated v6e 2x2 with empty compile caches: imports, cluster start,
           reservation and the run's start-up to its first update (``bench_ppo_vs_rllib``'s
           workbench worker, a few updates), against RLlib's PPO in a fresh process:
           imports, ``ray.init`` and building the algorithm (its worker, one iteration).
  warm     ``bench_startup.py``: on a running cluster with warm caches, learners started
           for the run against learners kept and warmed at reservation.
  actors   ``bench_anakin.py --kinds actors,actors_single``: actors mode on the slice
           against the same work in one process without Ray.
  anakin   ``bench_anakin.py --kinds anakin,single`` over ``--anakin-seeds`` seeds.
  rollouts ``bench_rollout_cpus.py``: Acrobot-v1 with 1, 2 and 4 rollout actors per host
           against one process.
  memory   ``bench_binder_memory.py`` for the quickstart on v6e 1x1 (Binder) and on the
           simulated 2x2, each against one plain process training the same PPO.

Medians over ``--runs`` runs (the seeds of the throughput parts). ``--parts`` runs a subset.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import harness

HERE = Path(__file__).resolve().parent
PPO_VS_RLLIB = HERE / "bench_ppo_vs_rllib.py"  # its workers: the cold part's two sides
ROOT = HERE.parent
README = ROOT / "README.md"
BEGIN, END = "<!-- bench_slice_overhead:begin -->", "<!-- bench_slice_overhead:end -->"
PARTS = ("cold", "warm", "actors", "anakin", "rollouts", "memory")


def _bench(script: str, *args: str) -> dict:
    """Run ``benchmarks/<script>`` with ``args``; its JSON record."""
    done = subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{script} {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def cold(runs: int) -> dict:
    log_dir = Path(tempfile.mkdtemp(prefix="bench-cold-"))
    workbench, rllib = [], []
    for seed in range(runs):
        # Empty compile caches for this run only (the worker inherits the environment).
        os.environ["WORKBENCH_JAX_CACHE"] = tempfile.mkdtemp(prefix="cache-", dir=log_dir)
        workbench.append(harness.run_worker("workbench", seed,
                                            ["--workbench-env-steps", "8192"],
                                            900, log_dir, 2, PPO_VS_RLLIB))
        rllib.append(harness.run_worker("rllib", seed, ["--rllib-max-env-steps", "4000",
                                                        "--rllib-eval-every", "1000"],
                                        900, log_dir, 2, PPO_VS_RLLIB))
    os.environ.pop("WORKBENCH_JAX_CACHE")
    fields = ("imports_s", "cluster_start_s", "reserve_s", "startup_s", "cold_start_s",
              "cold_start_with_imports_s")
    return {
        "workbench": [{k: r.get(k) for k in (*fields, "startup_profile", "error")}
                      for r in workbench],
        "rllib": [{k: r.get(k) for k in ("imports_s", "ray_init_s", "build_s", "cold_start_s",
                                         "cold_start_with_imports_s", "error")}
                  for r in rllib],
        "median": {
            "workbench": {k: harness.median([r.get(k) for r in workbench]) for k in fields},
            "rllib": {k: harness.median([r.get(k) for r in rllib])
                      for k in ("imports_s", "cold_start_s", "cold_start_with_imports_s")},
        },
    }


def run_parts(parts: list[str], runs: int, anakin_seeds: int) -> dict:
    seeds = ",".join(str(s) for s in range(runs))
    record: dict[str, Any] = {}
    for part in parts:
        clock = harness.timed()
        if part == "cold":
            record[part] = cold(runs)
        elif part == "warm":
            record[part] = _bench("bench_startup.py", "--runs", str(max(2, runs + 1)),
                                  "--pause-s", "20")
        elif part == "actors":
            record[part] = _bench("bench_anakin.py", "--kinds", "actors,actors_single",
                                  "--seeds", seeds)
        elif part == "anakin":
            record[part] = _bench("bench_anakin.py", "--kinds", "anakin,single", "--seeds",
                                  ",".join(str(s) for s in range(anakin_seeds)))
        elif part == "rollouts":
            record[part] = _bench("bench_rollout_cpus.py", "--repeats", str(runs))
        elif part == "memory":
            record[part] = {topology: _bench("bench_binder_memory.py", "--topology", topology)
                            for topology in ("1x1", "2x2")}
        record[part]["part_s"] = round(clock.s, 1)
    return record


def _row(figure: str, ours: float | None, peer: str, theirs: float | None, unit: str,
         goal: str, met: bool | None) -> dict:
    return {"figure": figure, "workbench": ours, "peer": peer, "peer_value": theirs,
            "unit": unit, "ratio": harness.ratio(ours, theirs, 2), "goal": goal, "met": met}


def summary(record: dict) -> list[dict]:
    """One row per figure of the issue's bars, with its peer from the same invocation."""
    rows = []
    if "cold" in record:
        ours = record["cold"]["median"]["workbench"]["cold_start_with_imports_s"]
        theirs = record["cold"]["median"]["rllib"]["cold_start_with_imports_s"]
        rows.append(_row("cold start to the first update (imports, cluster, reservation, "
                         "start-up; empty caches)", ours,
                         "RLlib PPO: imports, ray.init, build", theirs, "s",
                         "< 20 s", ours is not None and ours < 20))
    if "warm" in record:
        warm = record["warm"]
        rows.append(_row("start-up on a running cluster, processes started for the run",
                         warm["fresh"]["median_later_startup_s"], "-", None, "s", "< 8 s",
                         warm["fresh"]["median_later_startup_s"] < 8))
        first = warm["warm"]["first_startup_s"]
        rows.append(_row("first run after a reservation that warmed its learners for it",
                         first, "processes started for the run",
                         warm["fresh"]["first_startup_s"], "s", "< 3 s", first < 3))
        other = warm["warm_for_another_config"]["startup_s"]
        rows.append(_row("first run after a reservation warmed for another config", other,
                         "processes started for the run", warm["fresh"]["first_startup_s"],
                         "s", "< 3 s", other < 3))
    if "actors" in record:
        median = record["actors"]["median"]
        ours, theirs = (median.get(k, {}) for k in ("actors", "actors_single"))
        rows.append(_row("actors mode env-steps/s", ours.get("env_steps_per_s"),
                         "the same in one process", theirs.get("env_steps_per_s"), "1/s",
                         ">= 0.7x", _at_least(ours, theirs, "env_steps_per_s", 0.7)))
        rows.append(_row("actors mode loop s to the training target",
                         ours.get("time_to_train_target_s"), "the same in one process",
                         theirs.get("time_to_train_target_s"), "s", "<= 1/0.7x",
                         _at_most(ours, theirs, "time_to_train_target_s", 1 / 0.7)))
    if "anakin" in record:
        median = record["anakin"]["median"]
        ours, theirs = (median.get(k, {}) for k in ("anakin", "single"))
        rows.append(_row("Anakin env-steps/s", ours.get("env_steps_per_s"),
                         "the same learner in one process", theirs.get("env_steps_per_s"),
                         "1/s", ">= 0.7x", _at_least(ours, theirs, "env_steps_per_s", 0.7)))
        rows.append(_row("Anakin loop s to the training target",
                         ours.get("time_to_train_target_s"), "the same learner in one process",
                         theirs.get("time_to_train_target_s"), "s", "<= 1.5x",
                         _at_most(ours, theirs, "time_to_train_target_s", 1.5)))
    if "rollouts" in record:
        rollouts = record["rollouts"]
        peer = rollouts["one_process_env_steps_per_s"]["median"]
        for count, side in rollouts["slice_env_steps_per_s"].items():
            rows.append(_row(f"Acrobot-v1 env-steps/s, {count} rollout actor(s) per host",
                             side["median"], "one process", peer, "1/s", "-", None))
    if "memory" in record:
        for topology, limit in (("2x2", 2.5 * 1024), ("1x1", 1.5 * 1024)):
            memory = record["memory"][topology]
            ours = memory["quickstart"]["peak_pss_mib"]
            rows.append(_row(f"peak PSS of the quickstart's process tree, v6e {topology}", ours,
                             "one plain process", memory["peer_single_process"]["peak_pss_mib"],
                             "MiB", f"<= {limit:g} MiB", ours <= limit))
    return rows


def _at_least(ours: dict, theirs: dict, key: str, factor: float) -> bool | None:
    if ours.get(key) is None or not theirs.get(key):
        return None
    return ours[key] >= factor * theirs[key]


def _at_most(ours: dict, theirs: dict, key: str, factor: float) -> bool | None:
    if ours.get(key) is None or not theirs.get(key):
        return None
    return ours[key] <= factor * theirs[key]


def markdown(rows: list[dict], command: str, total_s: float) -> str:
    def show(value: float | None, unit: str) -> str:
        if value is None:
            return "-"
        if unit == "1/s":
            return f"{value / 1000:.1f}k/s"
        return f"{value:.2f} s" if unit == "s" else f"{value:.0f} {unit}"

    lines = [f"Generated by `{command}` ({total_s / 60:.0f} min; medians):", "",
             "| figure | workbench | peer | peer's | ratio | goal | met |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        met = {True: "yes", False: "no", None: "-"}[r["met"]]
        lines.append(f"| {r['figure']} | {show(r['workbench'], r['unit'])} | {r['peer']} | "
                     f"{show(r['peer_value'], r['unit'])} | "
                     f"{'-' if r['ratio'] is None else r['ratio']} | {r['goal']} | {met} |")
    return "\n".join(lines)


def write_readme(table: str) -> None:
    text = README.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} section to rewrite")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--runs", type=int, default=3,
                        help="runs (seeds) per figure; medians over them")
    parser.add_argument("--anakin-seeds", type=int, default=20)
    parser.add_argument("--readme", action="store_true",
                        help="rewrite the README's table from this invocation")
    args = parser.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or args.runs < 1 or args.anakin_seeds < 1:
        parser.error(f"--parts takes {', '.join(PARTS)} (got {', '.join(unknown) or 'them'}); "
                     "--runs and --anakin-seeds must be at least 1")
    clock = harness.timed()
    before = harness.machine()
    record = run_parts(parts, args.runs, args.anakin_seeds)
    rows = summary(record)
    total_s = clock.s
    harness.print_result({"benchmark": "slice_overhead", "machine_before": before,
                          "machine_after": harness.machine(), "total_s": round(total_s, 1),
                          "summary": rows, **record})
    if args.readme:
        command = ".venv/bin/python benchmarks/bench_slice_overhead.py " + " ".join(
            a for a in sys.argv[1:] if a != "--readme")
        write_readme(markdown(rows, command.strip(), total_s))


if __name__ == "__main__":
    main()
