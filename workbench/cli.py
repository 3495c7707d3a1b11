"""The ``workbench`` command line; each subcommand is a thin call into the Python API."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from collections.abc import Callable
from typing import NoReturn

from workbench.cluster import ClusterError, parse_address
from workbench.slice import SliceUnavailableError
from workbench.tpu import CatalogError, all_shapes, parse_generation, parse_shape


class _Parser(argparse.ArgumentParser):
    """Usage mistakes as one line that names the flag and what it takes, not a usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}. `{self.prog} --help` lists every option.\n")


def _whole(minimum: int) -> Callable[[str], int]:
    """An argparse type for whole numbers of at least ``minimum``."""
    wanted = "a positive whole number" if minimum == 1 else f"a whole number >= {minimum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def cmd_topologies(args: argparse.Namespace) -> int:
    shapes = all_shapes()
    if args.generation:
        gen = parse_generation(args.generation)
        shapes = tuple(s for s in shapes if s.generation == gen)
    if args.json:
        print(json.dumps([s.describe() for s in shapes], indent=1))
        return 0
    rows = [["gen", "topology", "pod type", "chips", "hosts", "chips/host", "HBM/chip",
             "HBM total", "bf16 TF/chip", "bf16 TF total", "gke-tpu-accelerator",
             "gke-tpu-topology"]]
    for s in shapes:
        rows.append([
            s.generation.name, s.topology, s.pod_type, str(s.chips), str(s.hosts),
            str(s.chips_per_host), f"{s.generation.hbm_gib_per_chip:g} GiB",
            f"{s.hbm_gib:g} GiB", f"{s.generation.peak_bf16_tflops_per_chip:g}",
            f"{s.peak_bf16_tflops:g}", s.generation.gke_accelerator, s.topology,
        ])
    print(_table(rows))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from workbench.cluster import local_cluster
    from workbench.doctor import run_checks

    cluster = local_cluster([("v6e", "2x2")]) if args.simulated else None
    try:
        findings = run_checks(args.address)
    finally:
        if cluster is not None:
            cluster.shutdown()
    for finding in findings:
        print(finding)
    return 1 if any(f.level == "error" for f in findings) else 0


def _run_training(args: argparse.Namespace, config) -> dict:
    """Reserve the slice (starting a simulated cluster if no address is known), train
    with a progress bar, release, and return the result record."""
    import contextlib
    import os

    from tqdm import tqdm

    from workbench.cluster import connect, local_cluster
    from workbench.engine import train
    from workbench.slice import reserve

    cpus_per_chip = 2  # the learner's CPU, and room for a rollout actor beside it
    with contextlib.ExitStack() as stack:
        address = getattr(args, "address", None) or os.environ.get("RAY_ADDRESS")
        if address:
            connect(address)
        else:
            print(f"Starting a simulated cluster with one {args.generation} {args.topology} "
                  "slice...", file=sys.stderr)
            stack.enter_context(local_cluster([(args.generation, args.topology)]))
        tpu_slice = stack.enter_context(
            reserve(args.generation, args.topology, timeout_s=args.reserve_timeout,
                    cpus_per_chip=cpus_per_chip)
        )
        print(tpu_slice.layout(), file=sys.stderr)
        bar = stack.enter_context(
            tqdm(total=config.total_env_steps, unit="step", unit_scale=True, file=sys.stderr)
        )

        def progress(row: dict) -> None:
            bar.update(row["steps_this_update"])
            recent = row["mean_return_100"] or row["mean_return_this_update"] or 0.0
            bar.set_postfix(ret=f"{recent:.0f}", sps=f"{row['env_steps_per_s'] or 0:.0f}")

        result = train(tpu_slice, config, on_update=progress)
    return result.to_json()


def _train_config(args: argparse.Namespace):
    from workbench.engine import TrainConfig

    return TrainConfig(
        env=args.env,
        mode=args.mode,
        total_env_steps=args.total_env_steps,
        seed=args.seed,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        stop_at_target=args.stop_at_target,
        envs_per_chip=args.envs_per_chip,
        rollout_length=args.rollout_length,
        sync=args.sync,
    )


def _check_before_start(args: argparse.Namespace) -> None:
    """Refuse, before the slow imports, what would only fail once a cluster is up."""
    parse_shape(args.generation, args.topology)
    if getattr(args, "address", None):
        parse_address(args.address)
    if getattr(args, "resume", False):
        if not args.checkpoint_dir:
            raise ValueError("--resume needs --checkpoint-dir: the directory of the run to "
                             "continue.")
        from workbench.checkpoint import require_checkpoint

        require_checkpoint(args.checkpoint_dir)


def cmd_train(args: argparse.Namespace) -> int:
    if args.algo != "ppo":
        raise ValueError(f"Unknown algorithm {args.algo!r}; available: ppo.")
    _check_before_start(args)
    config = _train_config(args)
    config.validate()
    record = _run_training(args, config)
    summary = {k: v for k, v in record.items() if k != "curve"}
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(record, out, indent=1)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    _check_before_start(args)
    from workbench.engine import TrainConfig

    started = time.monotonic()
    config = TrainConfig(total_env_steps=args.total_env_steps, seed=args.seed,
                         stop_at_target=True)
    config.validate()
    record = _run_training(args, config)
    print(
        f"PPO on {record['env']} over a simulated {record['generation']} {record['topology']} "
        f"slice ({record['chips']} learners on {record['hosts']} host(s)): greedy return "
        f"{record['final_return']:.1f} after {record['env_steps']} env steps; "
        f"training-target time {record['time_to_train_target_s']} s, "
        f"start-up {record['startup_s']:.1f} s, all done in {time.monotonic() - started:.0f} s."
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="workbench", description="Reinforcement learning on Cloud TPU slices with Ray and JAX."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    sub = parser.add_subparsers(dest="command", required=True)

    topo = sub.add_parser("topologies", help="list TPU generations and valid slice shapes")
    topo.add_argument("--generation", help="only this generation (v4, v5e, v5p, v6e, v7x)")
    topo.add_argument("--json", action="store_true", help="print JSON instead of a table")
    topo.set_defaults(func=cmd_topologies)

    doctor = sub.add_parser("doctor", help="pre-flight checks of this process and the cluster")
    doctor.add_argument("--address", help="Ray address (default: RAY_ADDRESS)")
    doctor.add_argument("--simulated", action="store_true",
                        help="check a freshly started simulated cluster instead")
    doctor.set_defaults(func=cmd_doctor)

    demo = sub.add_parser("demo", help="PPO on CartPole on an embedded simulated slice")
    demo.add_argument("--generation", default="v6e")
    demo.add_argument("--topology", default="2x2")
    demo.add_argument("--total-env-steps", type=_whole(1), default=500_000)
    demo.add_argument("--seed", type=_whole(0), default=0)
    demo.add_argument("--reserve-timeout", type=_seconds, default=60.0)
    demo.set_defaults(func=cmd_demo)

    run = sub.add_parser("train", help="train on a reserved slice (simulated if no address)")
    run.add_argument("--generation", default="v6e")
    run.add_argument("--topology", default="2x2")
    run.add_argument("--env", default="CartPole-v1")
    run.add_argument("--algo", default="ppo")
    run.add_argument("--mode", default="actors", choices=["actors", "anakin"],
                     help="actors: gymnasium envs on host CPUs; anakin: JAX envs on the chip")
    run.add_argument("--total-env-steps", type=_whole(1), default=500_000)
    run.add_argument("--seed", type=_whole(0), default=0)
    run.add_argument("--json", help="write the result record here")
    run.add_argument("--address", help="Ray address (default: RAY_ADDRESS, else simulated)")
    run.add_argument("--checkpoint-dir")
    run.add_argument("--checkpoint-every", type=_whole(0), default=0)
    run.add_argument("--resume", action="store_true")
    run.add_argument("--stop-at-target", action="store_true")
    run.add_argument("--envs-per-chip", type=_whole(1), default=16)
    run.add_argument("--rollout-length", type=_whole(1), default=64)
    run.add_argument("--sync", default="auto", choices=["auto", "gradients", "batch"])
    run.add_argument("--reserve-timeout", type=_seconds, default=60.0)
    run.set_defaults(func=cmd_train)

    from workbench import gke

    gke.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    try:
        return args.func(args)
    except (CatalogError, ValueError, ClusterError, SliceUnavailableError) as error:
        print(f"workbench: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("workbench: interrupted: training stopped after its current update (with a "
              "final checkpoint when --checkpoint-dir is set) and the slice was released.",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
