"""The run record: manifest.json says what ran, where, with what and how it ended."""

import json

from conftest import TINY, run_cli


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
    assert manifest["plan"]["task"]["global_size"] == 32
    assert manifest["started_at"] < manifest["finished_at"]
    assert manifest["metrics"]["test/acc"] == json.loads((run / "results.json").read_text())["test/acc"]
    assert manifest["best_checkpoint"].endswith(".ckpt")
    assert set(manifest["git"]) == {"commit", "dirty"}


def test_a_run_dir_with_only_its_record_and_lock_leftovers_is_discarded(tmp_path):
    from hydralight.rundir.record import discard_unused_run_dir

    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    for name in ("config.yaml", "manifest.json", ".lock", ".lock.break.1234.abcd", "train.log"):
        (run / name).write_text("x")
    assert discard_unused_run_dir(run) and not run.exists()
    kept = tmp_path / "kept"
    (kept / "checkpoints").mkdir(parents=True)
    (kept / ".lock.break.1").write_text("x")
    assert not discard_unused_run_dir(kept) and (kept / "checkpoints").is_dir()
