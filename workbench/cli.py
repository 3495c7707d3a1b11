"""The ``workbench`` command line; each subcommand is a thin call into the Python API."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from workbench.tpu import CatalogError, all_shapes, parse_generation


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


def cmd_demo(args: argparse.Namespace) -> int:
    from workbench.cluster import local_cluster
    from workbench.placement import probe_chips
    from workbench.slice import reserve

    started = time.monotonic()
    print(f"Starting a simulated cluster with one {args.generation} {args.topology} slice...")
    with local_cluster([(args.generation, args.topology)]) as cluster:
        print(f"  up in {time.monotonic() - started:.1f} s at {cluster.address}")
        with reserve(args.generation, args.topology, timeout_s=60) as tpu_slice:
            print(tpu_slice.layout())
            for report in probe_chips(tpu_slice):
                print(f"  chip {report.rank}: host {report.host}, "
                      f"TPU_VISIBLE_CHIPS={report.visible_chips}, slice {report.tpu_name}")
        print("Released the slice; stopping the cluster.")
    print(f"Done in {time.monotonic() - started:.1f} s.")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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

    demo = sub.add_parser("demo", help="the embedded simulated slice, end to end")
    demo.add_argument("--generation", default="v6e")
    demo.add_argument("--topology", default="2x2")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    try:
        return args.func(args)
    except CatalogError as error:
        print(f"workbench: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("workbench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
