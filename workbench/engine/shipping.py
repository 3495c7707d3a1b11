"""Getting a user's own code (an algorithm, an environment factory) to the cluster.

Ray pickles functions and classes of an importable module by reference, so a worker must
be able to import that module. A notebook cell's code (``__main__``) travels by value
already; code in a file of the user's own beside the notebook (``my_algos.py``) would not,
and the learners would fail to unpickle it. Such modules, those not installed as packages
(nothing under ``site-packages``), are registered to travel by value too. Installed
packages are expected on the cluster's image, as the workbench itself is.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

_INSTALLED = ("site-packages", "dist-packages")


def _local_module(name: str):
    module = sys.modules.get(name)
    if module is None or name == "__main__" or name.split(".")[0] == "workbench":
        return None
    path = getattr(module, "__file__", None)
    if not path or any(part in _INSTALLED for part in Path(path).parts):
        return None
    return module


def ship_by_value(objects: Iterable[object]) -> list[str]:
    """Make the modules that define ``objects`` travel by value to Ray workers when they
    are the user's own files; returns the names of the modules registered."""
    from ray import cloudpickle

    shipped = []
    for obj in objects:
        module = _local_module(getattr(obj, "__module__", "") or "")
        if module is not None:
            cloudpickle.register_pickle_by_value(module)
            shipped.append(module.__name__)
    return shipped


def user_code_of(plan) -> list[object]:
    """What of a run's plan may be the user's own code: the algorithm's build function
    (and the functions it closes over), its config class, the JAX env factory."""
    build = plan.algorithm.build
    found: list[object] = [build, plan.algorithm.config_type, type(plan.hyperparameters)]
    for cell in getattr(build, "__closure__", None) or ():
        if callable(cell.cell_contents):
            found.append(cell.cell_contents)
    if plan.jax_env is not None and callable(plan.jax_env.factory):
        found.append(plan.jax_env.factory)
    for point in ("entry_point", "vector_entry_point"):
        entry_point = getattr(plan.env_ref, point, None)
        if callable(entry_point):
            found.append(entry_point)  # an env class registered from the user's own code
    entry = (getattr(plan.env_ref, "kwargs", None) or {}).get("entry")
    if entry is not None and callable(entry.factory):
        found.append(entry.factory)  # a JAX env of the user's, stepped through its view
    found += [w for w in plan.config.wrappers if not isinstance(w, str)]
    return found
