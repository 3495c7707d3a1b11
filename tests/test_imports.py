"""What importing the package costs: ``import workbench`` and ``import workbench.ui`` (a
notebook's first cell, the command line's start) load no JAX, flax or optax. Those take
seconds to import; the learners and the code that trains import them when they need them."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("jax", "jaxlib", "flax", "optax")

# Run in a fresh interpreter: this one has imported JAX through other tests already.
PROBE = f"""
import json, sys
import workbench
import workbench.ui
heavy = {HEAVY!r}
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in heavy)))
"""


def test_importing_workbench_and_its_ui_loads_no_jax_flax_or_optax():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == [], f"importing workbench loaded {loaded[:10]}; run python -X importtime " \
                         "-c 'import workbench.ui' to see through which imports"
