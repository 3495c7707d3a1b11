"""Where chips come from: the TPU catalog, connecting to a Ray cluster (or starting the
simulated one), reserving a whole slice, and the files and variables of GKE TPU hosts.

Knows nothing of training. ``workbench.tpu.slice`` is the only importer of
``ray.util.tpu`` in the project.
"""

from workbench.tpu.catalog import (
    GENERATIONS,
    CatalogError,
    Generation,
    SliceShape,
    all_shapes,
    generation_names,
    parse_generation,
    parse_shape,
    topologies,
)
from workbench.tpu.cluster import (
    ClusterError,
    ClusterSession,
    Connection,
    LocalCluster,
    connect,
    connection,
    disconnect,
    join_or_start,
    local_cluster,
    parse_address,
)
from workbench.tpu.slice import Slice, SliceInfo, SliceUnavailableError, list_slices, reserve

__all__ = [
    "GENERATIONS",
    "CatalogError",
    "ClusterError",
    "ClusterSession",
    "Connection",
    "Generation",
    "LocalCluster",
    "Slice",
    "SliceInfo",
    "SliceShape",
    "SliceUnavailableError",
    "all_shapes",
    "connect",
    "connection",
    "disconnect",
    "generation_names",
    "join_or_start",
    "list_slices",
    "local_cluster",
    "parse_address",
    "parse_generation",
    "parse_shape",
    "reserve",
    "topologies",
]
