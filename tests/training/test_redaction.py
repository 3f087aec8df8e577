"""Secrets (environment and command-line values) kept out of every file a run writes, wandb's included."""

import pytest
from test_loggers import SECRET, wandb_run

pytestmark = pytest.mark.slow


def test_secrets_never_reach_a_written_file(tiny_data, tmp_path):
    run, recs = wandb_run(
        tiny_data,
        tmp_path,
        "+extra.token=${oc.env:MY_SERVICE_TOKEN}",
        MY_SERVICE_TOKEN=SECRET,
        DB_PASSWORD=SECRET + "x",
    )
    assert recs  # the wandb file was read back, and it is among the files searched below
    leaked = [str(p) for p in run.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert leaked == []
    assert "<redacted>" in (run / "config.yaml").read_text()


def test_secrets_given_on_the_command_line_stay_out_of_every_file(tiny_data, tmp_path):
    run, recs = wandb_run(tiny_data, tmp_path, f"+service.api_token={SECRET}", f"+db.password={SECRET}x")
    assert recs
    leaked = [str(p) for p in run.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert leaked == []
    # wandb records the command line itself (its run metadata): it saw the redacted one.
    (run_file,) = (run / "wandb").glob("offline-run-*/run-*.wandb")
    assert b"api_token=<redacted>" in run_file.read_bytes()
