"""The fast tier stays fast: a test without the slow marker that asks for a cluster fixture,
connects Ray or starts a cluster's processes fails, with a message saying to mark it.

An inner pytest run, under a copy of this folder's conftest.py (and of the support package
it imports), of tests that break the rule; the real cluster never starts (each is refused
before it would)."""

from __future__ import annotations

import shutil
import tempfile
import textwrap
from pathlib import Path

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py")
SUPPORT = Path(__file__).with_name("support")

INNER = textwrap.dedent('''
    import subprocess
    import sys
    from pathlib import Path

    import pytest
    import ray

    import workbench as wb

    REAL_INIT = ray.init


    @pytest.fixture(scope="module")
    def a_slice(sim_cluster):
        yield sim_cluster


    def test_asks_for_the_cluster(cluster):
        pass


    def test_asks_through_a_fixture_of_its_own(a_slice):
        pass


    def test_connects_ray():
        ray.init(address="127.0.0.1:1")


    def test_starts_the_simulated_cluster():
        wb.local_cluster([("v6e", "2x2")], connect=False)


    def test_starts_a_ray_node():
        ray_cli = str(Path(sys.executable).with_name("ray"))
        subprocess.run([ray_cli, "start", "--help"], capture_output=True)


    def test_bad_cluster_arguments_are_still_refused_first():
        with pytest.raises(ValueError, match="cpus_per_chip"):
            wb.local_cluster([("v6e", "2x2")], connect=False, cpus_per_chip=0)


    def test_other_processes_start():
        subprocess.run([sys.executable, "-c", "pass"], check=True)


    @pytest.mark.slow
    def test_a_marked_test_is_left_alone():
        assert ray.init is REAL_INIT
        subprocess.run([sys.executable, "-c", "pass", "workbench.tpu.simulator"], check=True)
''')


def test_unmarked_tests_that_want_a_cluster_fail_saying_to_mark_them(pytester, monkeypatch):
    pytester.makeconftest(CONFTEST.read_text())
    shutil.copytree(SUPPORT, pytester.path / "support",
                    ignore=shutil.ignore_patterns("__pycache__"))
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\nmarkers = ["slow: slow tier"]\n')
    pytester.makepyfile(test_inner=INNER)
    # A temp folder of the test's own: a refused start of the simulator leaves its folder.
    temp = tempfile.mkdtemp(prefix="tiers-")
    monkeypatch.setenv("TMPDIR", temp)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    try:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", timeout=300)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    result.assert_outcomes(passed=3, failed=3, errors=2)
    mark_it = "but is not marked slow. A test that starts or joins a Ray cluster belongs to " \
        "the slow tier*mark it @pytest.mark.slow*"
    result.stdout.fnmatch_lines_random([
        f"*test_inner.py::test_asks_for_the_cluster uses the Ray cluster fixture cluster, "
        f"sim_cluster, {mark_it}",
        f"*test_inner.py::test_asks_through_a_fixture_of_its_own uses the Ray cluster fixture "
        f"sim_cluster, {mark_it}",
        f"*test_inner.py::test_connects_ray called ray.init*{mark_it}",
        f"*test_inner.py::test_starts_the_simulated_cluster starts the simulated cluster "
        f"(workbench.tpu.simulator), {mark_it}",
        f"*test_inner.py::test_starts_a_ray_node starts a Ray node (`ray start`), {mark_it}",
    ])
    for name in ("bad_cluster_arguments_are_still_refused_first", "other_processes_start",
                 "a_marked_test_is_left_alone"):
        result.stdout.fnmatch_lines([f"PASSED test_inner.py::test_{name}"])
