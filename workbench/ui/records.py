"""Metrics a notebook claims, recorded in its own output where a test can read them.

``record(final_return=412.0)`` displays one output carrying a workbench-specific JSON
mimetype (plus a plain-text line for people); ``read_records(path)`` collects every such
output of an executed notebook. Nothing else is needed: the executed ``.ipynb`` that
papermill writes is the record.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

METRICS_MIMETYPE = "application/vnd.workbench.metrics+json"


def _plain(name: str, value: Any) -> Any:
    """``value`` as JSON-ready Python, or a ValueError saying which metric is wrong."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        value = value.item()  # numpy and JAX scalars
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(
                f"Metric {name!r} is {value}, which JSON cannot hold; record a finite number "
                "or None for a value that was not reached."
            )
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(f"{name}[{i}]", v) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        return {str(k): _plain(f"{name}.{k}", v) for k, v in value.items()}
    raise ValueError(
        f"Metric {name!r} is a {type(value).__name__}; record numbers, strings, booleans, "
        "None, or lists/dicts of those."
    )


def record(**metrics: Any) -> None:
    """Show metrics in the cell output under :data:`METRICS_MIMETYPE`.

    Args:
        **metrics: name=value pairs; values are numbers, strings, booleans, None, or
            lists/dicts of those (numpy scalars are converted).

    Raises:
        ValueError: no metrics, or a value that JSON cannot hold (NaN, an object).
    """
    if not metrics:
        raise ValueError("record() needs at least one metric, e.g. record(final_return=412.0).")
    plain = {name: _plain(name, value) for name, value in metrics.items()}
    from IPython.display import display

    text = "recorded " + ", ".join(f"{k}={json.dumps(v)}" for k, v in plain.items())
    display({METRICS_MIMETYPE: plain, "text/plain": text}, raw=True)


def read_records(notebook: str | os.PathLike | Mapping) -> dict[str, Any]:
    """Every metric recorded in an executed notebook; a later record of a name wins.

    Args:
        notebook: the path of an ``.ipynb`` file, or a notebook already loaded as a dict.

    Returns:
        A dict of metric name to value (empty if the notebook recorded nothing).

    Raises:
        ValueError: the file is not a notebook (no ``cells`` list).
    """
    if isinstance(notebook, Mapping):
        content = notebook
        where = "the given notebook"
    else:
        where = os.fspath(notebook)
        with open(where, encoding="utf-8") as handle:
            content = json.load(handle)
    cells = content.get("cells")
    if not isinstance(cells, list):
        raise ValueError(f"{where} is not a Jupyter notebook: it has no list of cells.")
    found: dict[str, Any] = {}
    for cell in cells:
        for output in cell.get("outputs", ()):
            data = output.get("data") or {}
            if METRICS_MIMETYPE not in data:
                continue
            payload = data[METRICS_MIMETYPE]
            # nbformat keeps "+json" payloads as objects; tolerate a string from other writers.
            found.update(json.loads(payload) if isinstance(payload, str) else payload)
    return found
