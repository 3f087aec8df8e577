"""The benchmark suite runs end to end (tiny sizes): a smoke test, never a timed assertion."""

import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow


def test_benchmark_smoke_run_writes_its_report(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "benchmark.py"), "--smoke", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    text = (tmp_path / "RESULTS.md").read_text()
    for row in ("framework overhead", "data path", "time to 99%", "start-up", "DDP on CPU", "cheap step"):
        assert row in text
    assert (tmp_path / "results.png").read_bytes()[:4] == b"\x89PNG"
