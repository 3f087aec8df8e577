"""`mode=predict` through `train.py`: a trained run's checkpoint predicts on the test split, an image folder or
any folder of images, and writes one file into a new run dir, the same on 1 and 2 processes; what cannot be
predicted is refused in one line, leaving no run dir."""

import csv
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from conftest import HELPERS, ROOT, TINY, make_image_folder, one_line, run_cli, run_python

# The module comes from the checkpoint: no model on the command line.
PREDICT = [arg for arg in TINY if not arg.startswith("model=")]
PROJECT = HELPERS / "user_project"


def ok(result):
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])
    return result


def rows(run):
    with (run / "predictions.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def results(run):
    return json.loads((run / "results.json").read_text())


@pytest.fixture(scope="module")
def trained(tiny_data, tmp_path_factory):
    """A tiny MNIST run (200 test samples), trained once for this module's tests."""
    run = tmp_path_factory.mktemp("trained") / "run"
    ok(run_cli(TINY, run, tiny_data))
    return run


@pytest.mark.slow
def test_predictions_of_the_test_split_give_the_run_s_test_accuracy(trained, tiny_data, tmp_path):
    best = results(trained)["best_checkpoint"]
    out = tmp_path / "pred"
    result = ok(run_cli(["mode=predict", f"ckpt_path={best}", *PREDICT], out, tiny_data))
    table = rows(out)
    assert [int(r["sample"]) for r in table] == list(range(200))  # one row per test sample, in order
    assert set(table[0]) == {"sample", "label", "predicted", "probability"}
    accuracy = sum(r["label"] == r["predicted"] for r in table) / len(table)
    assert accuracy == pytest.approx(results(trained)["test/acc"], abs=1e-6)
    assert all(0.0 < float(r["probability"]) <= 1.0 for r in table)
    assert result.stdout.splitlines()[-1].startswith(f"predictions: 200 rows in {out / 'predictions.csv'}")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "finished" and manifest["metrics"]["predict/acc"] == pytest.approx(accuracy)
    assert not list(out.glob("predictions.rank*"))
    # resume=RUN_DIR predicts with that run's best checkpoint, into a new dir; the run itself is left as it was.
    before = {p.name: p.stat().st_mtime_ns for p in trained.iterdir()}
    again = tmp_path / "again"
    ok(run_cli(["mode=predict", f"resume={trained}", *PREDICT], again, tiny_data))
    assert (again / "predictions.csv").read_bytes() == (out / "predictions.csv").read_bytes()
    assert {p.name: p.stat().st_mtime_ns for p in trained.iterdir()} == before
    # Without hydra.run.dir, as a user types it: Hydra's dated dir (not the run's own, which it would refuse).
    files = {p: p.read_bytes() for p in trained.rglob("*") if p.is_file()}
    dated = run_python([sys.executable, str(ROOT / "train.py"), "mode=predict", f"resume={trained}", *PREDICT],
                       {**os.environ, "DATA_DIR": str(tiny_data)}, cwd=tmp_path)  # fmt: skip
    written = ok(dated).stdout.splitlines()[-1].split(" rows in ")[1].split(" (")[0]
    assert (
        Path(written).parent.parent.parent == tmp_path / "outputs"
        and Path(written).read_bytes() == (out / "predictions.csv").read_bytes()
    )
    assert {p: p.read_bytes() for p in trained.rglob("*") if p.is_file()} == files


@pytest.mark.slow
def test_one_and_two_processes_write_the_same_file(trained, tiny_data, tmp_path):
    best = results(trained)["best_checkpoint"]
    files = {}
    for devices in (1, 2):
        out = tmp_path / f"pred{devices}"
        args = ["mode=predict", f"ckpt_path={best}", *PREDICT, f"hardware.devices={devices}", "strategy=ddp"]
        ok(run_cli(args, out, tiny_data, timeout=600))
        files[devices] = (out / "predictions.csv").read_bytes()
    assert files[1] == files[2]
    assert files[1].count(b"\n") == 201


@pytest.mark.slow
def test_predictions_on_an_image_folder_and_on_a_plain_folder_of_images(tmp_path):
    images = make_image_folder(tmp_path / "images", n_train=20, n_test=5)
    folder = ["data=imagefolder", f"data.root={images}", "data.val_size=8", "batch.global_size=8", "batch.eval_size=6",
              "hardware=cpu", "trainer.max_epochs=1"]  # fmt: skip
    run = tmp_path / "run"
    ok(run_cli([*folder, "model=mlp"], run))
    # The test split: each row names its file and its class by name.
    out = tmp_path / "pred"
    ok(run_cli(["mode=predict", f"resume={run}", *folder], out))
    table = rows(out)
    assert len(table) == 20
    assert sorted(r["file"] for r in table) == sorted(str(p) for p in (images / "test").rglob("*.png"))
    assert all(r["file"].split("/")[-2] == r["label"] for r in table)
    assert {r["predicted"] for r in table} <= {"blue", "green", "red", "yellow"}
    # A folder of loose images (another size, grey): resized and converted to what the network takes, unlabelled.
    from PIL import Image

    loose = tmp_path / "loose"
    loose.mkdir()
    for i, path in enumerate(sorted((images / "test" / "red").glob("*.png"))[:3]):
        Image.open(path).convert("L").resize((40, 40)).save(loose / f"{i}.png")
    (loose / "notes.txt").write_text("not an image")
    out = tmp_path / "loose-pred"
    # The default global batch (128) is larger than the 72 training images: predicting trains nothing, and goes on.
    anybatch = [arg for arg in folder if not arg.startswith("batch.global_size")]
    result = ok(run_cli(["mode=predict", f"resume={run}", f"predict.source={loose}", *anybatch], out))
    table = rows(out)
    assert [r["file"] for r in table] == [str(loose / f"{i}.png") for i in range(3)]
    assert "label" not in table[0] and "accuracy" not in result.stdout.splitlines()[-1]
    # Class folders of the data's classes: labelled.
    labelled = tmp_path / "labelled"
    shutil.copytree(images / "test" / "green", labelled / "green")
    out = tmp_path / "labelled-pred"
    ok(run_cli(["mode=predict", f"resume={run}", f"predict.source={labelled}", *folder], out))
    assert {r["label"] for r in rows(out)} == {"green"} and len(rows(out)) == 5


@pytest.mark.slow
def test_charlm_writes_its_outputs_in_sample_order(tmp_path):
    text = tmp_path / "book.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 60)
    args = ["experiment=charlm", f"data.path={text}", "data.block_size=16", "model.width=16", "model.layers=1",
            "hardware=cpu", "trainer.max_epochs=1", "trainer.limit_train_batches=2"]  # fmt: skip
    run = tmp_path / "run"
    ok(run_cli(args, run))
    out = tmp_path / "pred"
    result = ok(run_cli(["mode=predict", f"resume={run}", *args], out))
    saved = torch.load(out / "predictions.pt", weights_only=True)
    blocks = (int(len(text.read_text()) * 0.1) - 1) // 16  # the test part, in blocks of 16
    assert saved["sample"].tolist() == list(range(blocks))
    assert saved["next"].shape == (blocks, 16) and saved["bits_per_char"].shape == (blocks,)
    assert result.stdout.splitlines()[-1].startswith(f"predictions: {blocks} rows in {out / 'predictions.pt'}")


@pytest.mark.slow
def test_a_module_without_predict_step_is_refused(tmp_path):
    env = {"PYTHONPATH": str(PROJECT)}
    data = ["model=regressor", "data=points", "hardware=cpu", "objective.metric=val/mse", "objective.direction=min",
            "batch.global_size=32", "trainer.max_epochs=1"]  # fmt: skip
    run = tmp_path / "run"
    ok(run_cli(data, run, cwd=PROJECT, **env))
    out = tmp_path / "pred"
    args = ["mode=predict", f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}", *data]
    line = one_line(run_cli(args, out, cwd=PROJECT, **env))
    assert "Regressor has none" in line and "predict_step" in line
    assert not out.exists()


@pytest.mark.slow
def test_a_data_module_with_several_predict_loaders_is_refused_in_one_line(tmp_path):
    env = {"PYTHONPATH": str(PROJECT)}
    data = ["model=regressor", "model._target_=my_tasks.regression.PredictingRegressor", "data=points",
            "hardware=cpu", "objective.metric=val/mse", "objective.direction=min", "batch.global_size=32",
            "trainer.max_epochs=1"]  # fmt: skip
    run = tmp_path / "run"
    ok(run_cli(data, run, cwd=PROJECT, **env))
    predict = ["mode=predict", f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}", *data]
    ok(run_cli(predict, tmp_path / "one", cwd=PROJECT, **env))  # one loader: 64 test points, in order
    written = torch.load(tmp_path / "one" / "predictions.pt", weights_only=True)
    assert written["sample"].tolist() == list(range(64))
    ok(run_cli([*predict, "hardware.devices=2", "strategy=ddp_spawn"], tmp_path / "spawn", cwd=PROJECT, **env))
    spawned = torch.load(tmp_path / "spawn" / "predictions.pt", weights_only=True)  # the data module pickled
    assert torch.equal(spawned["sample"], written["sample"]) and torch.allclose(spawned["predictions"],
                                                                                 written["predictions"])  # fmt: skip
    out = tmp_path / "two"
    line = one_line(run_cli([*predict, "data._target_=my_tasks.regression.TwoPredictSets"], out, cwd=PROJECT, **env))
    assert "TwoPredictSets.predict_dataloader returns 2; return one" in line, line
    assert not out.exists()


@pytest.mark.slow
def test_what_cannot_be_predicted_is_one_line_and_no_run_dir(trained, tiny_data, tmp_path):
    best = results(trained)["best_checkpoint"]
    cases = {
        "needs the checkpoint to predict with": ["mode=predict"],
        "does not exist": ["mode=predict", f"ckpt_path={tmp_path / 'missing.ckpt'}"],
        "both name the checkpoint": ["mode=predict", f"ckpt_path={best}", f"resume={trained}"],
        "is read by mode=predict only": [f"predict.source={tmp_path}"],
        "is not a folder": ["mode=predict", f"ckpt_path={best}", f"predict.source={tmp_path / 'nothing'}"],
        "holds no images": ["mode=predict", f"ckpt_path={best}", f"predict.source={tmp_path}"],
        "holds a run already": ["mode=predict", f"ckpt_path={best}", f"hydra.run.dir={trained}"],
    }
    for expected, args in cases.items():
        out = tmp_path / "out"
        line = one_line(run_cli([*args, *PREDICT], out, tiny_data))
        assert expected in line, line
        assert not out.exists(), expected


@pytest.mark.slow
def test_a_checkpoint_naming_a_target_no_config_names_is_refused_as_mode_eval_refuses_it(tiny_data, tmp_path):
    victim = tmp_path / "planted"
    net = {"_target_": "builtins.open", "file": str(victim), "mode": "w"}
    model = {"_target_": "hydralight.tasks.classifier.Classifier", "_recursive_": False, "net": net}
    record = {"module": model["_target_"], "model": model, "sizes": {"num_classes": 10, "input_shape": [1, 28, 28]}}
    ckpt = tmp_path / "planted.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"net": net}, "hydralight": record, "global_step": 1}, ckpt)
    lines = {}
    for mode in ("eval", "predict"):
        lines[mode] = one_line(run_cli([f"mode={mode}", f"ckpt_path={ckpt}", *PREDICT], tmp_path / mode, tiny_data))
        assert not (tmp_path / mode).exists() and not victim.exists()
    assert "none of your configs names" in lines["predict"] and lines["predict"] == lines["eval"]


@pytest.mark.slow
def test_a_checkpoint_is_never_tested_on_other_data_than_its_own_unless_named(tmp_path):
    env = {"PYTHONPATH": str(PROJECT)}
    named = ["objective.metric=val/mse", "objective.direction=min", "hardware=cpu", "batch.global_size=32"]
    run = tmp_path / "run"
    ok(run_cli(["model=regressor", "data=points", *named, "trainer.max_epochs=1"], run, cwd=PROJECT, **env))
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    for mode in ("eval", "predict"):
        # Without data=, the shipped default data module would take the place of the one it was trained on.
        out = tmp_path / mode
        line = one_line(run_cli([f"mode={mode}", f"resume={run}", *named], out, cwd=PROJECT, **env))
        assert "was trained on my_tasks.regression.RegressionData" in line and "data=points" in line, line
        assert not out.exists()
    ok(run_cli(["mode=eval", f"resume={run}", "data=points", *named], tmp_path / "named", cwd=PROJECT, **env))
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
