"""A sweep job's pickles (submitit's `<id>_submitted.pkl`, `<id>_result.pkl`) hold no secret: while the job
runs, after it ends, and when the process that submitted it was killed."""

import os
import pickle
import signal
import sys
import time

import pytest
from conftest import HELPERS, ROOT, TINY, popen
from omegaconf import OmegaConf

from hydralight.launch.sealed import SECRETS_ENV, Sealed, share_secrets

SECRET = "sealed-secret-8d1f"


def test_a_sealed_object_is_pickled_without_its_secrets_and_read_back_with_them(monkeypatch):
    monkeypatch.delenv(SECRETS_ENV, raising=False)
    share_secrets([SECRET, "other-secret-77"])
    value = {
        "overrides": [f"+my_api_key={SECRET}", "seed=1"],
        "config": OmegaConf.create({"auth": {"api_key": SECRET}, "note": f"x{SECRET}y"}),
        "plain": "nothing to hide",
    }
    blob = pickle.dumps(Sealed(value))
    assert SECRET.encode() not in blob and b"other-secret" not in blob
    back = pickle.loads(blob)
    assert back["overrides"] == value["overrides"] and back["plain"] == "nothing to hide"
    assert OmegaConf.to_container(back["config"]) == OmegaConf.to_container(value["config"])
    # Where the secrets were not handed on, the references read as redacted, never as something else.
    monkeypatch.delenv(SECRETS_ENV)
    assert pickle.loads(blob)["overrides"][0] == "+my_api_key=<redacted>"


def files_holding(folder, secret):
    return sorted(str(p) for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes())


@pytest.mark.slow
def test_a_local_job_s_pickles_hold_no_secret_while_it_runs_nor_after_its_submitter_is_killed(tiny_data, tmp_path):
    sweep = tmp_path / "sweep"
    slow = ["+callbacks.slow._target_=slow.SlowSteps", "+callbacks.slow.seconds=0.3"]
    command = [
        sys.executable, str(ROOT / "train.py"), "-m", "hydra/launcher=local", "cluster=local",
        "hardware.cpus_per_task=1", "hardware.mem_gb=1", *TINY, "trainer.limit_train_batches=null", *slow,
        f"+my_api_key={SECRET}", f"+auth={{token: {SECRET}x}}", f"hydra.sweep.dir={sweep}",
    ]  # fmt: skip
    env = {**os.environ, "DATA_DIR": str(tiny_data), "PYTHONPATH": str(HELPERS)}
    env.pop(SECRETS_ENV, None)
    submitter = popen(command, env)
    deadline = time.monotonic() + 120
    while not list(sweep.glob(".submitit/*/*_submitted.pkl")) or not (sweep / "0" / "csv" / "metrics.csv").exists():
        assert submitter.poll() is None and time.monotonic() < deadline, "the job never started"
        time.sleep(0.2)
    assert files_holding(sweep, SECRET) == []  # the job runs; its pickle is on disk
    os.kill(submitter.pid, signal.SIGKILL)  # the submitter alone, as a lost login shell; its local job runs on
    submitter.wait(timeout=30)
    while not list(sweep.glob(".submitit/*/*_result.pkl")):
        assert time.monotonic() < deadline + 120, "the job never ended"
        time.sleep(0.2)
    assert (sweep / "0" / "results.json").is_file()  # the job ran with its secrets
    assert files_holding(sweep, SECRET) == []
