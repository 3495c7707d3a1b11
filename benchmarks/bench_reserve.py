"""Cold start of the simulated cluster, and reserve/release of a running slice.

Prints one JSON object. The peer, run in the same invocation on the same cluster, is a
plain Ray placement group of the same bundles with no slice semantics (no head
reservation, no label selectors), so the ratio is the price of all-or-nothing slices.

    .venv/bin/python benchmarks/bench_reserve.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import ray

import workbench as wb


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def measure(generation: str, topology: str, repeats: int) -> dict:
    shape = wb.parse_shape(generation, topology)
    started = time.monotonic()
    cluster = wb.local_cluster([(generation, topology)])
    cold_start_s = time.monotonic() - started
    reserve_s, release_s, peer_s = [], [], []
    try:
        for _ in range(repeats):
            t0 = time.monotonic()
            tpu_slice = wb.reserve(generation, topology, timeout_s=60)
            _ = tpu_slice.chips
            t1 = time.monotonic()
            tpu_slice.release()
            t2 = time.monotonic()
            reserve_s.append(t1 - t0)
            release_s.append(t2 - t1)

            t0 = time.monotonic()
            pg = ray.util.placement_group([{"TPU": 1, "CPU": 1}] * shape.chips, strategy="SPREAD")
            ray.get(pg.ready(), timeout=60)
            peer_s.append(time.monotonic() - t0)
            ray.util.remove_placement_group(pg)
    finally:
        cluster.shutdown()
    return {
        "shape": shape.label,
        "hosts": shape.hosts,
        "chips": shape.chips,
        "cold_start_s": round(cold_start_s, 2),
        "reserve_median_s": _median(reserve_s),
        "release_median_s": _median(release_s),
        "peer_plain_placement_group_median_s": _median(peer_s),
        "reserve_vs_peer_ratio": round(statistics.median(reserve_s) / statistics.median(peer_s), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    results = [measure("v6e", "2x2", args.repeats), measure("v6e", "4x4", args.repeats)]
    print(json.dumps({"benchmark": "reserve", "repeats": args.repeats, "results": results},
                     indent=1))


if __name__ == "__main__":
    main()
