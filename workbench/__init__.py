"""A Jupyter-first reinforcement-learning workbench for Cloud TPU slices on Ray and JAX."""

from workbench import envs as envs  # registers the workbench/* ids with gymnasium
from workbench.cluster import ClusterError, LocalCluster, connect, disconnect, local_cluster
from workbench.slice import Slice, SliceUnavailableError, list_slices, reserve
from workbench.tpu import CatalogError, SliceShape, parse_shape, topologies

__all__ = [
    "CatalogError",
    "ClusterError",
    "LocalCluster",
    "Slice",
    "SliceShape",
    "SliceUnavailableError",
    "connect",
    "disconnect",
    "list_slices",
    "local_cluster",
    "parse_shape",
    "reserve",
    "topologies",
]
