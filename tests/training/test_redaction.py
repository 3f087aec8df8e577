"""Secrets (environment and command-line values) kept out of every file a run writes, wandb's included."""

import pytest
from conftest import TINY, run_cli
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


# Secrets of each kind: an override named *_KEY, one nested under another key, a sweep over secret values, and
# an environment variable the config reads.
COMMAND_LINE_SECRET = "s3cr3t-value-123"
NESTED_SECRET = "hf-nested-token-777"
SWEPT_SECRETS = ("swept-first-4411", "swept-second-5522")
ENV_SECRET = "env-service-token-909"
DICT_SECRET = "dict-valued-key-4242"  # inside a dict value, under a key that names no secret itself
SECRET_ARGS = [
    f"+my_api_key={COMMAND_LINE_SECRET}",
    f"+creds.HF_TOKEN={NESTED_SECRET}",
    "+extra.service=${oc.env:MY_SERVICE_TOKEN}",
    f"+auth={{api_key: {DICT_SECRET}, user: me}}",
]
STEPS = [*TINY, "trainer.max_steps=2", "logger=csv"]


def files_holding_secrets(folder, secrets):
    """Every file under `folder`, read as bytes (checkpoints and databases included), that holds a secret."""
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert files
    return sorted(str(p) for p in files if any(s.encode() in p.read_bytes() for s in secrets))


def test_a_sweep_writes_no_secret_into_any_file(tiny_data, tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", *STEPS, *SECRET_ARGS, f"+db.password={','.join(SWEPT_SECRETS)}", f"hydra.sweep.dir={sweep}"]
    result = run_cli(args, sweep, tiny_data, MY_SERVICE_TOKEN=ENV_SECRET)
    assert result.returncode == 0, result.stderr[-2000:]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]
    assert (sweep / "0" / "csv" / "metrics.csv").is_file() and list(sweep.glob("*/train.log"))
    secrets = [COMMAND_LINE_SECRET, NESTED_SECRET, ENV_SECRET, DICT_SECRET, *SWEPT_SECRETS]
    assert files_holding_secrets(sweep, secrets) == []
    # The records still say which keys were given, and each job's own swept value is gone too.
    assert "my_api_key=<redacted>" in (sweep / "multirun.yaml").read_text()
    assert "password: <redacted>" in (sweep / "1" / "config.yaml").read_text()


def test_a_single_run_writes_no_secret_into_any_file(tiny_data, tmp_path):
    run = tmp_path / "run"
    result = run_cli([*STEPS, *SECRET_ARGS, "+db_password=pw1"], run, tiny_data, MY_SERVICE_TOKEN=ENV_SECRET)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (run / "results.json").is_file() and (run / "train.log").is_file()
    # A short one too, in every text record (binary files are not searched: 3 bytes turn up in weights by chance).
    texts = [p for p in run.rglob("*") if p.is_file() and p.suffix in (".yaml", ".json", ".log", ".csv")]
    assert [str(p) for p in texts if "pw1" in p.read_text()] == []
    assert files_holding_secrets(run, [COMMAND_LINE_SECRET, NESTED_SECRET, ENV_SECRET, DICT_SECRET]) == []
    assert "user: me" in (run / "config.yaml").read_text()  # only the secret is hidden
    assert "HF_TOKEN=<redacted>" in (run / ".hydra" / "overrides.yaml").read_text()


def test_a_value_under_a_secret_name_is_hidden_at_any_depth():
    from hydralight.rundir.redaction import redact

    config = {"auth": {"api_key": "k-1234", "user": "me", "token": None}, "list": [{"password": 1234}], "seed": 1}
    assert redact(config, []) == {"auth": {"api_key": "<redacted>", "user": "me", "token": None},
                                  "list": [{"password": "<redacted>"}], "seed": 1}  # fmt: skip


def test_a_short_secret_is_replaced_where_its_name_sets_it():
    """A value too short to replace wherever it stands (`pw1` would mangle any text holding those letters) is
    replaced where a secret's name sets it: Hydra's records of the command line and of the config."""
    from hydralight.rundir.redaction import redact

    assert redact("db_password: pw1\nlr: 0.1\nmonkey: abc\napi_key: null\n", []) == (
        "db_password: <redacted>\nlr: 0.1\nmonkey: abc\napi_key: null\n"
    )
    assert redact(["+db_password=pw1", "x=pw1"], []) == ["+db_password=<redacted>", "x=pw1"]
    # A sweep over short secrets: every value, in a list or a choice, beside a long one replaced already.
    assert redact("- +db_password=pw1,pw2\n- +api_key=choice(ab,cd)\n- +token=<redacted>,x1\n- y=pw1,pw2\n", []) == (
        "- +db_password=<redacted>,<redacted>\n- +api_key=choice(<redacted>,<redacted>)\n"
        "- +token=<redacted>,<redacted>\n- y=pw1,pw2\n"
    )
