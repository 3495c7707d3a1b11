"""The installed workbench's version (what checkpoints and ``--version`` report)."""

from __future__ import annotations

from importlib import metadata


def version() -> str:
    try:
        return metadata.version("tpu-rl-workbench")
    except metadata.PackageNotFoundError:  # a checkout on sys.path without an install
        return "0+unknown"
