"""Run manifest, wandb offline runs read back from their files, and secrets kept out of every file."""

import json
import sys
from pathlib import Path

from conftest import TINY, run_cli

sys.path.insert(0, str(Path(__file__).parent / "helpers"))
from wandb_file import records  # noqa: E402

SECRET = "planted-secret-4f9a2c"


def test_manifest_records_the_run(tiny_data, tmp_path):
    run = tmp_path / "run"
    result = run_cli(TINY, run, tiny_data)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "finished"
    assert manifest["overrides"] == [*TINY, f"hydra.run.dir={run}"][: len(TINY)]
    assert manifest["command"][1].endswith("train.py")
    for package in ("torch", "pytorch-lightning", "hydra-core", "wandb", "python"):
        assert manifest["versions"][package]
    assert manifest["machine"]["cpu_cores"] >= 1 and manifest["machine"]["cpu_model"]
    assert manifest["machine"]["gpus"] == []
    assert manifest["plan"]["task"]["global_batch"] == 32
    assert manifest["started_at"] < manifest["finished_at"]
    assert manifest["metrics"]["test/acc"] == json.loads((run / "results.json").read_text())["test/acc"]
    assert manifest["best_checkpoint"].endswith(".ckpt")
    assert set(manifest["git"]) == {"commit", "dirty"}


def wandb_run(tiny_data, tmp_path, *extra, **env):
    run = tmp_path / "run"
    result = run_cli([*TINY, "logger=wandb", *extra], run, tiny_data, WANDB_SILENT="true", HOME=str(tmp_path), **env)
    assert result.returncode == 0, result.stderr
    (path,) = (run / "wandb").glob("offline-run-*/run-*.wandb")
    return run, records(path)


def of_kind(recs, kind):
    return [getattr(r, kind) for r in recs if r.WhichOneof("record_type") == kind]


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


def test_resumed_run_continues_the_same_wandb_run(tiny_data, tmp_path):
    run, first = wandb_run(tiny_data, tmp_path)
    (run / "wandb").rename(tmp_path / "first-wandb")
    _, again = wandb_run(tiny_data, tmp_path, "trainer.max_epochs=2")
    assert of_kind(first, "run")[0].run_id == of_kind(again, "run")[0].run_id


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
