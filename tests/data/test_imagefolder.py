"""data=imagefolder: class folders decoded once into a cached tensor, the same training guarantees as MNIST."""

import json
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY, one_line, run_cli
from PIL import Image

from hydralight.data import ImageFolderDataModule
from hydralight.errors import UserError

FOLDER = ["data=imagefolder", *(a for a in TINY if not a.startswith("data."))]


def module(root: Path, cache_dir: Path, **kwargs) -> ImageFolderDataModule:
    options = {"global_size": 32, "eval_size": 50, "val_size": 0.1, **kwargs}
    return ImageFolderDataModule(str(root), cache_dir=str(cache_dir), **options)


def results(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())


def test_sizes_are_known_before_setup_without_decoding(image_folder, tmp_path):
    dm = module(image_folder, tmp_path)
    assert (dm.num_classes, dm.input_shape) == (4, (3, 32, 32))
    assert dm.listing.classes == ["blue", "green", "red", "yellow"]
    assert not (tmp_path / "imagefolder").exists()  # nothing decoded, nothing cached yet
    grey = module(image_folder, tmp_path, mode="L", size=[24, 16])
    assert grey.input_shape == (1, 24, 16)


def test_hidden_files_and_folders_are_left_out_and_counted(fresh_image_folder, tmp_path, caplog):
    # What a notebook, an OS or an editor leaves beside the images: a copy of an image in a hidden folder
    # inside a class folder, a hidden class folder, a hidden file.
    red = fresh_image_folder / "train" / "red"
    (red / ".ipynb_checkpoints").mkdir()
    shutil.copy(red / "0000.png", red / ".ipynb_checkpoints" / "0000-checkpoint.png")
    (fresh_image_folder / "train" / ".ipynb_checkpoints").mkdir()
    shutil.copy(red / "0001.png", fresh_image_folder / "train" / ".ipynb_checkpoints" / "x.png")
    shutil.copy(red / "0002.png", red / "._0002.png")
    with caplog.at_level("INFO", logger="hydralight.data.imagefolder"):
        dm = module(fresh_image_folder, tmp_path)
        listing = dm.listing
    assert listing.classes == ["blue", "green", "red", "yellow"]
    assert len(listing.train) == 4 * 20 and all(not p.parent.name.startswith(".") for p, _ in listing.train)
    assert "left out 3 hidden files and folders" in caplog.text


def test_the_decode_cache_is_reused_and_rebuilt_when_a_file_changes(fresh_image_folder, tmp_path):
    first = module(fresh_image_folder, tmp_path)
    first.setup("fit")
    assert first.cache_reused is False
    assert [len(first.splits[s]) for s in ("train", "val", "test")] == [72, 8, 20]
    assert len(first.mean) == len(first.std) == 3
    again = module(fresh_image_folder, tmp_path)
    again.setup("fit")
    assert again.cache_reused is True
    assert torch.equal(first.splits["train"].images, again.splits["train"].images)
    # A changed image (new content, new modification time) makes the next run decode again.
    changed = fresh_image_folder / "train" / "red" / "0000.png"
    Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8)).save(changed)
    os.utime(changed, ns=(time.time_ns(), time.time_ns() + 10**9))
    after = module(fresh_image_folder, tmp_path)
    after.setup("fit")
    assert after.cache_reused is False
    assert not torch.equal(first.content()["train"], after.content()["train"])
    assert len(list((tmp_path / "imagefolder").glob("*.pt"))) == 1  # rebuilt in place, not added


def test_tensor_and_per_sample_loaders_yield_the_same_batches(image_folder, tmp_path):
    fast, classic = (
        module(image_folder, tmp_path, loader="tensor"),
        module(image_folder, tmp_path, loader="torchvision"),
    )
    for dm in (fast, classic):
        dm.setup("fit")
    assert fast.mean == pytest.approx(classic.mean) and fast.std == pytest.approx(classic.std)
    for (x1, y1, ids1), (x2, y2, ids2) in zip(fast.train_dataloader(), classic.train_dataloader(), strict=True):
        x1, _, _ = fast.on_after_batch_transfer((x1, y1, ids1), 0)
        assert x1.shape == x2.shape == (32, 3, 32, 32)
        assert torch.allclose(x1, x2, atol=1e-5)
        assert torch.equal(y1, y2) and torch.equal(ids1, ids2)


def test_auto_loader_keeps_large_sets_out_of_memory(image_folder, tmp_path):
    assert module(image_folder, tmp_path).resolved_loader() == "tensor"
    assert module(image_folder, tmp_path, max_memory_gb=1e-4).resolved_loader() == "torchvision"


def test_size_and_mode_settings_convert_every_image(fresh_image_folder, tmp_path):
    odd = fresh_image_folder / "train" / "blue" / "0001.png"
    Image.fromarray(np.full((20, 28), 128, dtype=np.uint8)).save(odd)  # grey and another size
    with pytest.raises(UserError, match=r"0001.png is 1x20x28 .* but .* is 3x32x32; set data.size"):
        module(fresh_image_folder, tmp_path).prepare_data()
    dm = module(fresh_image_folder, tmp_path, size=16, mode="RGB")
    dm.setup("fit")
    assert dm.splits["train"].images.shape[1:] == (3, 16, 16)


def test_an_unreadable_image_is_named_or_skipped(fresh_image_folder, tmp_path):
    bad = fresh_image_folder / "train" / "green" / "0003.png"
    bad.write_bytes(b"not a png at all")
    with pytest.raises(UserError, match=r"0003.png cannot be read as an image .* data.skip_bad=true"):
        module(fresh_image_folder, tmp_path).prepare_data()
    dm = module(fresh_image_folder, tmp_path, skip_bad=True)
    dm.setup("fit")
    assert dm.content()["skipped"] == [str(bad)]
    assert sum(len(dm.splits[s]) for s in ("train", "val")) == 79


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda root: (root / "train" / "cat").mkdir(), r"train/cat holds no images"),
        (lambda root: (root / "test" / "dog").mkdir(), r"test/dog is a class that .*train does not have"),
        (lambda root: os.rename(root / "test", root / "tests"), r"has no test/ folder"),
        (lambda root: [shutil.rmtree(d) for d in (root / "test").iterdir()], r"test holds no class folders"),
        (lambda root: shutil.rmtree(root), r"data.root=.* is not a folder"),
    ],
    ids=["empty-class", "unknown-test-class", "no-test-folder", "empty-test-folder", "no-root"],
)
def test_a_folder_layout_that_cannot_train_is_one_line(fresh_image_folder, tmp_path, damage, message):
    damage(fresh_image_folder)
    with pytest.raises(UserError, match=message):
        module(fresh_image_folder, tmp_path).prepare_data()


def test_the_cli_refuses_a_corrupt_image_in_one_line_and_writes_nothing(fresh_image_folder, tmp_path):
    (fresh_image_folder / "test" / "red" / "0002.png").write_bytes(b"\x89PNG broken")
    run = tmp_path / "run"
    line = one_line(run_cli([*FOLDER, f"data.root={fresh_image_folder}"], run, tmp_path / "data"))
    assert "test/red/0002.png cannot be read as an image" in line
    assert not run.exists()


def test_the_schema_refuses_misspelt_and_wrong_settings(tmp_path):
    line = one_line(run_cli(["--cfg", "job", "data=imagefolder", "data.rooot=x"], tmp_path / "run"))
    assert "data.rooot is not a config key" in line
    line = one_line(run_cli(["--cfg", "job", "data=imagefolder", "data.mode=CMYK"], tmp_path / "run"))
    assert "data.mode=CMYK is not allowed; use one of L, LA, RGB, RGBA" in line
    line = one_line(run_cli(["data=imagefolder", "hardware=cpu"], tmp_path / "run"))
    assert "data=imagefolder needs data.root=PATH" in line


def test_the_preset_trains_to_high_accuracy_in_seconds(image_folder, tmp_path):
    run = tmp_path / "run"
    args = ["experiment=imagefolder", f"data.root={image_folder}", "hardware=cpu", "trainer.max_epochs=3"]
    before = sorted(image_folder.rglob("*"))
    start = time.monotonic()
    result = run_cli(args, run, tmp_path / "data", XDG_CACHE_HOME=str(tmp_path / "cache"))
    seconds = time.monotonic() - start
    assert result.returncode == 0, result.stderr[-3000:]
    # The decoded images went to the per-user cache: nothing into the images' folder or DATA_DIR.
    assert len(list((tmp_path / "cache" / "hydralight" / "imagefolder").glob("*.pt"))) == 1
    assert sorted(image_folder.rglob("*")) == before and not (tmp_path / "data").exists()
    accuracy = results(run)["test/acc"]
    with (tmp_path.parent / "imagefolder.txt").open("a") as f:
        f.write(f"experiment=imagefolder, 3 epochs: test/acc={accuracy:.4f} in {seconds:.1f} s\n")
    assert accuracy >= 0.95
    assert results(run)["world_size_invariance"] == {"holds": True, "reasons": []}


@pytest.mark.slow
def test_one_and_two_processes_train_the_same_network(image_folder, tmp_path):
    from test_distributed import final_weights, max_relative_difference

    args = [*FOLDER, f"data.root={image_folder}", "data.max_shift=2", "model=cnn", "trainer.precision=64-true",
            "trainer.limit_train_batches=null", "trainer.max_steps=20", "trainer.max_epochs=5", "seed=5"]  # fmt: skip
    one, two = tmp_path / "one", tmp_path / "two"
    for run, devices in ((one, 1), (two, 2)):
        result = run_cli([*args, f"hardware.devices={devices}"], run, tmp_path / "data")
        assert result.returncode == 0, result.stderr[-3000:]
        assert results(run)["global_step"] == 20
        assert results(run)["metrics"]["test/samples"] == 80
    worst = max_relative_difference(final_weights(one), final_weights(two))
    with (tmp_path.parent / "invariance.txt").open("a") as f:
        f.write(f"imagefolder cnn+shift float64: {worst:.3g}\n")
    assert worst < 1e-4, worst


@pytest.mark.slow
def test_sigkill_then_resume_ends_exactly_like_an_uninterrupted_run(image_folder, tmp_path):
    from test_reliability import start, wait_for, weights

    args = [*FOLDER, f"data.root={image_folder}", "data.max_shift=2", "model=cnn", "trainer.max_epochs=3",
            "trainer.limit_train_batches=null", "callbacks.last_checkpoint.every_n_steps=4", "seed=9"]  # fmt: skip
    plain, killed, data = tmp_path / "plain", tmp_path / "killed", tmp_path / "data"
    assert run_cli(args, plain, data).returncode == 0
    proc = start([*args, "+callbacks.slow._target_=slow.SlowSteps", "+callbacks.slow.seconds=0.1"], killed, data)
    wait_for(killed / "checkpoints" / "last.ckpt", proc)
    time.sleep(1.0)  # a few steps past the checkpoint: redone identically after the resume
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    step_at_kill = torch.load(killed / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert 0 < step_at_kill < 18
    resumed = run_cli(args, killed, data)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "continuing from this run's own" in resumed.stdout + resumed.stderr
    a, b = weights(plain), weights(killed)
    assert all(torch.equal(a[k], b[k]) for k in a), "weights differ after resume"
    assert results(plain)["test/acc"] == results(killed)["test/acc"]


@pytest.mark.parametrize(
    "poison",
    [
        lambda c: {**c, "train_labels": torch.full_like(c["train_labels"], 200)},  # labels past the classes
        lambda c: {**c, "train": torch.zeros((len(c["train"]), 3, 8, 8), dtype=torch.uint8)},  # other sizes
        lambda c: {**c, "test": c["test"][:3], "test_labels": c["test_labels"][:3]},  # counts that do not add up
        lambda c: {k: v for k, v in c.items() if k != "test_labels"},  # a key missing
    ],
    ids=["labels", "sizes", "counts", "keys"],
)
def test_a_cache_that_does_not_hold_what_it_claims_is_rebuilt(fresh_image_folder, tmp_path, poison):
    first = module(fresh_image_folder, tmp_path)
    first.setup("fit")
    (path,) = (tmp_path / "imagefolder").glob("*.pt")
    torch.save(poison(torch.load(path, weights_only=True)), path)  # the matching key kept
    again = module(fresh_image_folder, tmp_path)
    again.setup("fit")
    assert again.cache_reused is False
    assert torch.equal(first.content()["train_labels"], again.content()["train_labels"])


def test_an_unwritable_cache_folder_costs_only_the_cache(fresh_image_folder, tmp_path, caplog):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would be")  # unwritable even for root
    with caplog.at_level("WARNING"):
        dm = module(fresh_image_folder, blocked)
        dm.setup("fit")
    assert dm.cache_reused is False and len(dm.splits["train"]) == 72
    assert "cannot be written" in caplog.text and "decoding without it" in caplog.text
