"""Cold start of the simulated cluster, and reserve/release of a running slice.

Prints one JSON object. The peer, run in the same invocation on the same cluster, is a
plain Ray placement group of the same bundles with no slice semantics (no head
reservation, no label selectors), so the ratio is the price of all-or-nothing slices.

    .venv/bin/python benchmarks/bench_reserve.py --repeats 5
"""

from __future__ import annotations

import argparse

import harness
import ray

import workbench as wb


def measure(generation: str, topology: str, repeats: int) -> dict:
    shape = wb.parse_shape(generation, topology)
    with harness.timed() as cold_start:
        cluster = wb.local_cluster([(generation, topology)])
    reserve_s, release_s, peer_s = [], [], []
    try:
        for _ in range(repeats):
            with harness.timed() as reserve:
                tpu_slice = wb.reserve(generation, topology, timeout_s=60)
                _ = tpu_slice.chips
            with harness.timed() as release:
                tpu_slice.release()
            reserve_s.append(reserve.s)
            release_s.append(release.s)

            with harness.timed() as peer:
                pg = ray.util.placement_group([{"TPU": 1, "CPU": 1}] * shape.chips,
                                              strategy="SPREAD")
                ray.get(pg.ready(), timeout=60)
            peer_s.append(peer.s)
            ray.util.remove_placement_group(pg)
    finally:
        cluster.shutdown()
    return {
        "shape": shape.label,
        "hosts": shape.hosts,
        "chips": shape.chips,
        "cold_start_s": round(cold_start.s, 2),
        "reserve_median_s": harness.median(reserve_s),
        "release_median_s": harness.median(release_s),
        "peer_plain_placement_group_median_s": harness.median(peer_s),
        "reserve_vs_peer_ratio": harness.median_ratio(reserve_s, peer_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    results = [measure("v6e", "2x2", args.repeats), measure("v6e", "4x4", args.repeats)]
    harness.print_result({"benchmark": "reserve", "repeats": args.repeats, "results": results})


if __name__ == "__main__":
    main()
