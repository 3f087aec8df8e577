"""Weights & Biases runs read back from their offline files: metrics, config, plan, the mode, resumption."""

import base64
import json
import signal
import socket
import sys
import time

import pytest
from conftest import HELPERS, IN_CI, TINY, run_cli

sys.path.insert(0, str(HELPERS))
from wandb_file import records  # noqa: E402

SECRET = "planted-secret-4f9a2c"


def wandb_run(tiny_data, tmp_path, *extra, **env):
    run = tmp_path / "run"
    result = run_cli([*TINY, "logger=wandb", *extra], run, tiny_data, WANDB_SILENT="true", HOME=str(tmp_path), **env)
    assert result.returncode == 0, result.stderr
    *_, path = sorted((run / "wandb").glob("offline-run-*/run-*.wandb"))  # this attempt's: the latest
    return run, records(path)


def of_kind(recs, kind):
    return [getattr(r, kind) for r in recs if r.WhichOneof("record_type") == kind]


@pytest.mark.slow
def test_wandb_offline_run_holds_metrics_config_and_plan(tiny_data, tmp_path):
    run, recs = wandb_run(tiny_data, tmp_path)
    history = [
        {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in h.item} for h in of_kind(recs, "history")
    ]
    assert any("train/loss_step" in h for h in history)
    assert any("val/acc" in h for h in history)
    test = [h for h in history if "test/acc" in h][-1]
    assert test["test/acc"] == json.loads((run / "results.json").read_text())["test/acc"]
    config_keys = {u.key for c in of_kind(recs, "config") for u in c.update}
    assert {"config", "plan", "manifest"} <= config_keys
    (run_record,) = of_kind(recs, "run")
    assert "1x1cpu" in run_record.tags and "32-true" in run_record.tags
    assert of_kind(recs, "exit")[0].exit_code == 0


@pytest.mark.slow
def test_resumed_run_continues_the_same_wandb_run(tiny_data, tmp_path):
    run, first = wandb_run(tiny_data, tmp_path)
    # wandb's own files stay in the run dir (its core's log linked into the user's cache): the run continues.
    _, again = wandb_run(tiny_data, tmp_path, "trainer.max_epochs=2")
    assert of_kind(first, "run")[0].run_id == of_kind(again, "run")[0].run_id
    assert len(list((run / "wandb").glob("offline-run-*"))) == 2


@pytest.mark.slow
def test_a_continuation_refused_before_it_saves_leaves_the_wandb_folder_as_it_was(tiny_data, tmp_path):
    """A shorter budget than the finished run's is refused in `fit`, after wandb started: the offline run folder
    it made (the continued run's id, the refused config) went to the next `wandb sync` of the run."""
    budget = ["trainer.limit_train_batches=null", "trainer.max_steps=6"]
    run, _ = wandb_run(tiny_data, tmp_path, *budget)
    folder = run / "wandb"
    before = sorted(p.name for p in folder.iterdir()), (folder / "latest-run").readlink()
    refused = run_cli([*TINY, "logger=wandb", "trainer.limit_train_batches=null", "trainer.max_steps=4"], run,
                      tiny_data, WANDB_SILENT="true", HOME=str(tmp_path))  # fmt: skip
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "max_steps" in refused.stderr.strip().splitlines()[-1]
    assert (sorted(p.name for p in folder.iterdir()), (folder / "latest-run").readlink()) == before


FAKE_KEY = "0123456789abcdef0123456789abcdef01234567"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_wandb_mode_offline_from_the_environment_wins_over_a_key(tiny_data, tmp_path):
    # The server address leads nowhere: a run that tried to go online would say so and wait.
    began = time.monotonic()
    run, recs = wandb_run(
        tiny_data,
        tmp_path,
        WANDB_API_KEY=FAKE_KEY,
        WANDB_MODE="offline",
        WANDB_BASE_URL=f"http://127.0.0.1:{closed_port()}",
    )
    assert of_kind(recs, "run") and time.monotonic() - began < 120


@pytest.mark.slow
def test_unreachable_wandb_server_falls_back_to_offline_with_one_line(tiny_data, tmp_path):
    run = tmp_path / "run"
    env = {"WANDB_API_KEY": FAKE_KEY, "WANDB_BASE_URL": f"http://127.0.0.1:{closed_port()}", "WANDB_SILENT": "true"}
    result = run_cli([*TINY, "logger=wandb"], run, tiny_data, HOME=str(tmp_path), **env)
    assert result.returncode == 0, result.stderr[-2000:]
    notes = [line for line in result.stderr.splitlines() if "cannot be reached" in line]
    assert len(notes) == 1 and "logging offline" in notes[0] and "wandb sync" in notes[0]
    assert list((run / "wandb").glob("offline-run-*/run-*.wandb"))


def test_a_full_disk_while_the_history_is_written_leaves_whole_rows_and_names_the_file(small_disk):
    """A real full disk under csv/metrics.csv: the row being written is not left cut short (it would read as
    another step's row, kept by the rerun beside the step's real one), and the error names the file."""
    import csv
    import errno
    import shutil

    from hydralight.training.loggers import HistoryLogger

    history = HistoryLogger(str(small_disk / "run"))
    history.log_metrics({"train/loss": 1.0}, step=0)
    (small_disk / "filler").write_bytes(b"\0" * shutil.disk_usage(small_disk).free)
    logged = 1
    with pytest.raises(OSError) as raised:
        for step in range(1, 100_000):
            history.log_metrics({"train/loss": 1.0 / 3 + step}, step=step)
            logged += 1
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(history.path)
    with history.path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert logged > 10 and [int(r["step"]) for r in rows] == list(range(logged))
    assert all(float(r["train/loss"]) == (1.0 if i == 0 else 1.0 / 3 + i) for i, r in enumerate(rows))


@pytest.mark.slow
def test_a_fresh_start_in_a_run_dir_is_a_new_wandb_run(tiny_data, tmp_path):
    # The same dir, training again from scratch (resume=never) after an attempt that stopped: another training,
    # never appended to the first.
    stop = ["+callbacks.zz_signal._target_=signal_at.SignalAt", "+callbacks.zz_signal.step=3"]
    stopped = run_cli([*TINY, "logger=wandb", *stop], tmp_path / "run", tiny_data, WANDB_SILENT="true",
                      HOME=str(tmp_path), PYTHONPATH=str(HELPERS))  # fmt: skip
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-2000:]
    first = records(next((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")))
    _, again = wandb_run(tiny_data, tmp_path, "resume=never", "seed=7")
    assert of_kind(first, "run")[0].run_id != of_kind(again, "run")[0].run_id
    # Continued from its own checkpoint, it keeps its run.
    _, continued = wandb_run(tiny_data, tmp_path, "seed=7", "trainer.max_epochs=2")
    assert of_kind(continued, "run")[0].run_id == of_kind(again, "run")[0].run_id


def test_a_logger_of_the_users_is_checked_as_a_callback_is_and_writes_in_the_run_dir(tiny_data, tmp_path):
    run = tmp_path / "run"
    refused = run_cli([*TINY, "+logger.mine._target_=pytorch_lightning.loggers.CSVLogger", "+logger.mine.bogus=1"],
                      run, tiny_data)  # fmt: skip
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1].startswith(
        "error: logger.mine.bogus is not an argument of CSVLogger"
    ), refused.stderr[-2000:]
    assert not run.exists()
    # Without a save_dir of its own, it writes into the run dir.
    ran = run_cli([*TINY, "+logger.mine._target_=pytorch_lightning.loggers.CSVLogger"], run, tiny_data)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert (run / "lightning_logs" / "version_0" / "metrics.csv").is_file()


def test_wandb_runs_with_the_api_key_of_its_settings_and_records_no_secret(monkeypatch):
    """`+logger.wandb.settings.api_key=KEY` reaches wandb as given (it was replaced by `<redacted>`, and wandb
    refused the key); what wandb records (the run's name, tags) stays redacted."""
    from conftest import plan_of

    from hydralight.training.loggers import wandb_settings

    key = "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setattr(sys, "argv", ["train.py", f"+logger.wandb.settings.api_key={key}", "+name=my-secret-run"])
    spec = {"settings": {"api_key": key}, "name": key, "tags": [key]}
    settings = wandb_settings(spec, plan_of("logger=wandb"), "offline")
    assert settings["settings"]["api_key"] == key
    assert key not in json.dumps({k: v for k, v in settings.items() if k != "settings"})


def test_a_sweep_s_wandb_group_holds_its_day_and_time_so_sweeps_of_two_days_stay_apart():
    import dataclasses

    from conftest import plan_of

    from hydralight.training.loggers import wandb_settings

    plan = plan_of("logger=wandb")
    groups = []
    for day in ("2026-12-04", "2026-12-05"):
        paths = dataclasses.replace(plan.paths, sweep_dir=f"/work/multirun/{day}/11-00-00-000001", job_name="seed=1")
        groups.append(wandb_settings({}, dataclasses.replace(plan, paths=paths), "offline")["group"])
    assert groups == ["2026-12-04/11-00-00-000001", "2026-12-05/11-00-00-000001"]
    assert wandb_settings({"group": "mine"}, plan, "offline")["group"] == "mine"  # the user's own wins
    assert wandb_settings({}, plan, "offline")["group"] is None  # a single run belongs to no sweep


def test_a_tracker_that_cannot_start_is_said_with_its_cause_not_hydra_s_wrapper():
    from hydralight.training.loggers import _reason

    try:
        try:
            raise OSError(2, "No such file or directory")
        except OSError as cause:
            raise RuntimeError("Error in call to target 'hydralight.training.loggers.MLflowRunLogger':") from cause
    except RuntimeError as err:
        assert _reason(err) == "No such file or directory"


def test_a_tracking_server_is_probed_as_itself_and_without_the_login_in_its_host(tmp_path):
    """The health probe of an MLflow URI names MLflow (it named wandb), and a login in the URL is sent as a header
    (urllib took `alice:pw@127.0.0.1` for the host name: 'Name or service not known')."""
    import http.server
    import threading

    from hydralight.training.loggers import unanswered

    seen = []

    class NotMLflow(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            seen.append(self.headers.get("Authorization"))
            self.send_error(404)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotMLflow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        import urllib.request

        where = f"http://127.0.0.1:{server.server_port}"
        said = unanswered(urllib.request.Request(f"{where}/health"), where, 5, "MLflow", "MLFLOW_TRACKING_URI")
        assert (
            said == f"{where} answered HTTP 404 to the MLflow API: no MLflow server there (a proxy, or a wrong "
            "MLFLOW_TRACKING_URI)"
        )
        if not IN_CI:
            pytest.importorskip("mlflow", reason="logger=mlflow needs the mlflow extra")
        from conftest import plan_of

        from hydralight.training.loggers import start_mlflow_logger

        uri = f"http://alice:pw@127.0.0.1:{server.server_port}"
        plan = plan_of("logger=mlflow", f"logger.mlflow.tracking_uri={uri}", run_dir=tmp_path / "run")
        start_mlflow_logger(plan.loggers["mlflow"], plan)  # the server says 404: the run dir's own store
        assert seen[-1] == "Basic " + base64.b64encode(b"alice:pw").decode()
    finally:
        server.shutdown()
