"""logger=mlflow against a real MLflow tracking server on loopback (`mlflow server`, SQLite store): the run's
params, metrics and checkpoint read back through MLflow's client; a sweep's jobs as runs of one experiment; a
continued run in its own MLflow run; a server that does not answer leaves the run in the run dir's store."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import HELPERS, IN_CI, TINY, run_cli

sys.path.insert(0, str(HELPERS))
from unhelpful_servers import silent_server  # noqa: E402

if not IN_CI:
    pytest.importorskip("mlflow", reason="logger=mlflow needs the mlflow extra: pip install 'hydralight[mlflow]'")

pytestmark = pytest.mark.slow
STEPS = [*TINY, "trainer.max_steps=4", "logger=mlflow"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`mlflow server` on 127.0.0.1, its runs in SQLite and its artifacts in a folder, both in a temporary dir."""
    root = tmp_path_factory.mktemp("mlflow-server")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts"),
    ]  # fmt: skip
    log = (root / "server.log").open("w")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, (root / "server.log").read_text()[-3000:]
        time.sleep(0.5)
    yield uri
    os.killpg(proc.pid, 15)
    proc.wait(timeout=30)
    log.close()


def client(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def runs_of(uri, experiment="hydralight", where=""):
    found = client(uri).get_experiment_by_name(experiment)
    return client(uri).search_runs([found.experiment_id], filter_string=where) if found else []


def artifacts(uri, run_id, path=None):
    """Every artifact file of a run, walked down its folders."""
    found = []
    for entry in client(uri).list_artifacts(run_id, path):
        found += artifacts(uri, run_id, entry.path) if entry.is_dir else [entry.path]
    return found


def test_a_run_s_params_metrics_and_best_checkpoint_reach_the_server(server, tiny_data, tmp_path):
    run = tmp_path / "run"
    result = run_cli([*STEPS, "logger.mlflow.experiment_name=single"], run, tiny_data, MLFLOW_TRACKING_URI=server)
    assert result.returncode == 0, result.stderr[-3000:]
    (found,) = runs_of(server, "single")
    assert found.info.status == "FINISHED" and found.data.tags["hydralight.run_dir"] == str(run.resolve())
    assert found.data.params["config/optim/lr"] == "0.001" and found.data.params["plan/task/global_size"] == "32"
    history = client(server).get_metric_history(found.info.run_id, "train/loss_step")
    assert [h.step for h in history] == [0, 1, 2, 3]
    results = json.loads((run / "results.json").read_text())
    assert found.data.metrics["test/acc"] == pytest.approx(results["test/acc"])
    best = Path(results["best_checkpoint"]).name
    assert any(path.endswith(best) for path in artifacts(server, found.info.run_id)), best
    assert not (run / "mlflow").exists()  # the server has it all


def test_a_sweep_s_jobs_are_runs_of_one_experiment_and_a_continued_run_keeps_its_own(server, tiny_data, tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", *STEPS, "seed=1,2", "logger.mlflow.experiment_name=sweep", f"hydra.sweep.dir={sweep}"]
    result = run_cli(args, sweep, tiny_data, MLFLOW_TRACKING_URI=server)
    assert result.returncode == 0, result.stderr[-3000:]
    found = runs_of(server, "sweep")
    assert len(found) == 2 and {r.data.tags["sweep"] for r in found} == {str(sweep.resolve())}
    assert {r.data.tags["hydralight.run_dir"] for r in found} == {str((sweep / n).resolve()) for n in "01"}
    assert len({r.info.run_name for r in found}) == 2
    # The same dir with a larger budget continues its MLflow run: one run, its history to the new last step.
    run = tmp_path / "run"
    for steps in (4, 8):
        args = [*TINY, "trainer.limit_train_batches=null", f"trainer.max_steps={steps}", "logger=mlflow",
                "logger.mlflow.experiment_name=continued"]  # fmt: skip
        done = run_cli(args, run, tiny_data, MLFLOW_TRACKING_URI=server)
        assert done.returncode == 0, done.stderr[-3000:]
    (continued,) = runs_of(server, "continued")
    steps = [h.step for h in client(server).get_metric_history(continued.info.run_id, "train/loss_step")]
    assert steps == list(range(8))
    assert continued.data.params["config/trainer/max_steps"] == "4"  # as the run began; the change is a tag
    assert continued.data.tags["changed/config/trainer/max_steps"] == "8"


def test_a_fresh_start_in_a_run_dir_gets_its_own_mlflow_run_and_a_refused_attempt_changes_none(
    server, tiny_data, tmp_path
):
    """resume=never in a dir whose run stopped part way starts another training: a run of its own (it logged into
    the stopped one, each early step twice). A continuation refused before it saves leaves the finished run's
    status as it was (it was marked FAILED)."""
    run = tmp_path / "run"
    args = [*TINY, "trainer.limit_train_batches=null", "trainer.max_steps=6", "logger=mlflow",
            "logger.mlflow.experiment_name=fresh"]  # fmt: skip
    stop = ["+callbacks.zz_stop._target_=signal_at.SignalAt", "+callbacks.zz_stop.step=3"]
    cut = run_cli([*args, *stop], run, tiny_data, MLFLOW_TRACKING_URI=server, PYTHONPATH=str(HELPERS))
    assert cut.returncode == 143, cut.stderr[-3000:]
    done = run_cli([*args, "resume=never", "optim.lr=0.002"], run, tiny_data, MLFLOW_TRACKING_URI=server)
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = sorted(runs_of(server, "fresh"), key=lambda r: r.info.start_time)
    history = lambda r: [h.step for h in client(server).get_metric_history(r.info.run_id, "train/loss_step")]  # noqa: E731
    assert history(first) == [0, 1, 2] and history(second) == list(range(6))  # stopped as its 3rd step ended
    assert second.data.params["config/optim/lr"] == "0.002" and second.info.status == "FINISHED"
    # A shorter budget than the finished run's: refused in one line, the MLflow run left FINISHED.
    refused = run_cli([*args, "trainer.max_steps=4"], run, tiny_data, MLFLOW_TRACKING_URI=server)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert client(server).get_run(second.info.run_id).info.status == "FINISHED"


def test_a_server_that_does_not_answer_leaves_the_run_in_the_run_dir_s_store(tiny_data, tmp_path):
    run = tmp_path / "run"
    with silent_server() as silent:  # run_cli's deadline: MLflow's own retries would take minutes
        result = run_cli(STEPS, run, tiny_data, timeout=180, MLFLOW_TRACKING_URI=silent)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("mlflow: ")]
    assert len(lines) == 1 and "did not answer within 5 s" in lines[0] and str(run / "mlflow") in lines[0], lines
    (kept,) = runs_of(f"sqlite:///{run / 'mlflow' / 'mlflow.db'}")
    assert kept.info.status == "FINISHED" and "val/acc" in kept.data.metrics


def test_no_server_set_keeps_the_run_in_the_run_dir_and_says_so_in_one_line(tiny_data, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run = tmp_path / "run"
    result = run_cli(STEPS, run, tiny_data)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("mlflow: ")]
    assert len(lines) == 1 and "no tracking server set" in lines[0] and str(run / "mlflow") in lines[0], lines
    (kept,) = runs_of(f"sqlite:///{run / 'mlflow' / 'mlflow.db'}")
    assert kept.info.status == "FINISHED"
