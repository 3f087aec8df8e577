"""The benchmark suite runs end to end (tiny sizes): a smoke test, never a timed assertion."""

import sys

import pytest
from conftest import ROOT, run_python

pytestmark = pytest.mark.slow


def test_benchmark_smoke_run_writes_its_report(tmp_path):
    command = [sys.executable, str(ROOT / "scripts" / "benchmark.py"), "--smoke", "--out", str(tmp_path)]
    result = run_python(command, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    text = (tmp_path / "RESULTS.md").read_text()
    for row in (
        "framework overhead",
        "data path",
        "time to 99%",
        "start-up",
        "bare Lightning",
        "DDP on CPU",
        "cheap step",
    ):
        assert row in text
    assert (tmp_path / "results.png").read_bytes()[:4] == b"\x89PNG"
