"""Helpers the tests share (fixtures stay in ``tests/conftest.py``).

pytest's default import mode puts ``tests/`` on ``sys.path`` (it has no ``__init__.py``),
so a test module, and conftest.py, import these as ``from support.cluster_state import
live_actors``."""
