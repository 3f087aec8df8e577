import re
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from conftest import HELPERS, write_idx

from hydralight.data import MNISTDataModule, load_split
from hydralight.errors import UserError


def module(data_dir: Path, **kwargs) -> MNISTDataModule:
    options = {"val_size": 100, "global_size": 32, "eval_size": 64, "download": False, **kwargs}
    return MNISTDataModule(str(data_dir), **options)


def test_split_sizes_and_determinism(tiny_data):
    a, b, c = module(tiny_data, seed=1), module(tiny_data, seed=1), module(tiny_data, seed=2)
    for dm in (a, b, c):
        dm.setup("fit")
    assert [len(a.splits[s]) for s in ("train", "val", "test")] == [500, 100, 200]
    assert torch.equal(a.splits["val"].labels, b.splits["val"].labels)
    assert torch.equal(a.splits["val"].images, b.splits["val"].images)
    assert not torch.equal(a.splits["val"].images, c.splits["val"].images)


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"val_size": 600}, "data.val_size=600 must be between 1 and 599"),
        ({"val_size": 0.95}, "data.val_size=0.95 leaves 30 training samples, fewer than one global batch"),
        ({"max_shift": 28}, "data.max_shift=28 can move an image wholly out of its 28x28 frame"),
    ],
)
def test_settings_the_data_cannot_meet_are_refused_before_loading(tiny_data, settings, said):
    with pytest.raises(UserError, match=re.escape(said)):
        module(tiny_data, **settings).prepare_data()
    module(tiny_data, max_shift=27).prepare_data()  # one row or column of an image stays in its frame


def test_tensor_and_torchvision_loaders_yield_the_same_batches(tiny_data):
    fast, classic = module(tiny_data, loader="tensor"), module(tiny_data, loader="torchvision")
    for dm in (fast, classic):
        dm.setup("fit")
    for (x1, y1, ids1), (x2, y2, ids2) in zip(fast.train_dataloader(), classic.train_dataloader(), strict=True):
        x1, _, _ = fast.on_after_batch_transfer((x1, y1, ids1), 0)
        assert x1.dtype == x2.dtype == torch.float32
        assert x1.shape == x2.shape == (32, 1, 28, 28)
        assert torch.allclose(x1, x2, atol=1e-5)
        assert torch.equal(y1, y2)
        assert torch.equal(ids1, ids2)  # the sample ids that key per-sample randomness: the same in both loaders
    assert sum(len(y) for _, y, _ in fast.test_dataloader()) == 200


def test_wrong_magic_number_names_the_file(fresh_data):
    path = fresh_data / "MNIST" / "raw" / "train-labels-idx1-ubyte"
    path.write_bytes(b"\x00\x00\x08\x03" + path.read_bytes()[4:])
    with pytest.raises(UserError, match="train-labels-idx1-ubyte is not an MNIST IDX file"):
        load_split(fresh_data, train=True)


def test_truncated_file_names_the_file(fresh_data):
    path = fresh_data / "MNIST" / "raw" / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(UserError, match="t10k-images-idx3-ubyte has .* bytes .* truncated"):
        load_split(fresh_data, train=False)


def test_labels_outside_0_to_9_are_refused(fresh_data):
    write_idx(fresh_data / "MNIST" / "raw" / "t10k-labels-idx1-ubyte", np.full(200, 11))
    with pytest.raises(UserError, match="label 11 outside 0-9"):
        load_split(fresh_data, train=False)


def test_missing_data_without_download_says_where_and_how(tmp_path):
    with pytest.raises(UserError) as err:
        module(tmp_path / "nothing").prepare_data()
    message = str(err.value)
    assert str(tmp_path / "nothing" / "MNIST" / "raw") in message
    assert "DATA_DIR" in message and "internet" in message


def test_missing_data_without_download_writes_nothing(tmp_path):
    (tmp_path / "empty").mkdir()
    for data_dir in (tmp_path / "missing" / "deeper", tmp_path / "empty"):
        with pytest.raises(UserError, match="data.download=false"):
            module(data_dir).prepare_data()
    assert [p.name for p in tmp_path.rglob("*")] == ["empty"]  # no folder, no MNIST/raw, no lock


def test_a_failed_download_takes_away_what_it_made(tmp_path, monkeypatch):
    def fail_midway(cls, data_dir, train, **kwargs):  # as torchvision does: its folder first, then the mirrors
        raw = cls.raw_dir(data_dir)
        raw.mkdir(parents=True, exist_ok=True)
        (raw / "train-images-idx3-ubyte.gz").write_bytes(b"part")
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz:\nTried https://m/, got:\nHTTP Error 404\n")

    monkeypatch.setattr(MNISTDataModule, "_torchvision", classmethod(fail_midway))
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("mine")
    for data_dir in (tmp_path / "new" / "data", tmp_path / "kept"):
        # Each mirror's error is said with the file (the line named the file alone, then a colon).
        said = r"the download failed \(Error downloading train-images-idx3-ubyte.gz: Tried https://m/, got: HTTP Error 404\);"
        with pytest.raises(UserError, match=said):
            module(data_dir, download=True).prepare_data()
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == ["kept", "kept/notes.txt"]


@pytest.mark.slow
def test_a_run_refused_for_missing_data_leaves_no_data_folder(tmp_path):
    from conftest import TINY, one_line, run_cli

    missing = tmp_path / "nowhere" / "mnist"
    run = tmp_path / "run"
    line = one_line(run_cli([*TINY, f"data.data_dir={missing}", "data.download=false"], run))
    assert line == (
        f"error: MNIST not found in {missing}/MNIST/raw and data.download=false; set DATA_DIR (or data.data_dir) "
        f"to a folder holding MNIST/raw/, or connect to the internet to download into {missing}"
    )
    assert list(tmp_path.iterdir()) == []  # neither the data folder nor the run dir


def test_a_data_folder_missing_some_of_its_files_names_them(tmp_path):
    from conftest import make_mnist

    make_mnist(tmp_path)
    (tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(UserError, match=r"MNIST not found in .*/MNIST/raw \(missing t10k-labels-idx1-ubyte\) and"):
        MNISTDataModule(data_dir=str(tmp_path), download=False).prepare_data()


def test_fashion_mnist_composes_and_reads_its_own_idx_files(tmp_path):
    from conftest import make_mnist, plan_of

    from hydralight.data import FashionMNISTDataModule, build_datamodule

    make_mnist(tmp_path, name="FashionMNIST")
    plan = plan_of("data=fashion_mnist", f"data.data_dir={tmp_path}", "data.val_size=100", "seed=0")
    dm = build_datamodule(plan.data.spec, plan.data.offered)
    assert isinstance(dm, FashionMNISTDataModule) and (dm.num_classes, dm.input_shape) == (10, (1, 28, 28))
    dm.setup("fit")
    assert [len(dm.splits[s]) for s in ("train", "val", "test")] == [500, 100, 200]
    x, y, _ = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)
    assert x.shape == (128, 1, 28, 28) and x.dtype == torch.float32 and dm.mean == (0.2860,)
    (tmp_path / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x03broken")
    with pytest.raises(UserError, match="t10k-labels-idx1-ubyte is not a FashionMNIST IDX file"):
        FashionMNISTDataModule(str(tmp_path), download=False).prepare_data()


def test_the_core_gives_a_data_module_the_planned_settings_its_constructor_takes(monkeypatch):
    from hydralight.data import datamodule_kwargs, shards_by_rank
    from hydralight.data.contract import last_batch_note, replaced_by_plan

    monkeypatch.syspath_prepend(str(HELPERS))
    planned = {"global_size": 64, "batch_size": 16, "accumulation": 2, "eval_size": 100, "num_workers": 3,
               "pin_memory": True, "persistent_workers": True, "drop_last": True, "seed": 1}  # fmt: skip
    ours = datamodule_kwargs({"_target_": "hydralight.data.ImageFolderDataModule", "root": "x"}, planned)
    assert "batch_size" not in ours and ours["global_size"] == 64 and ours["seed"] == 1
    plain = {"_target_": "plain_datamodule.PlainDataModule", "record_dir": "x"}
    assert datamodule_kwargs(plain, planned) == {"batch_size": 16, "num_workers": 3}
    # A planned setting its config also gives (a lightning-hydra-template data config): the plan's value wins,
    # and one line says so when the two differ.
    assert datamodule_kwargs({**plain, "batch_size": 8, "num_workers": 3}, planned) == {
        "batch_size": 16,
        "num_workers": 3,
    }
    # It takes no drop_last: the plan cannot drop its last, smaller batch, and says so.
    assert "PlainDataModule takes no drop_last" in last_batch_note(plain, planned)
    assert last_batch_note(plain, {**planned, "drop_last": False}) is None
    assert last_batch_note({"_target_": "hydralight.data.ImageFolderDataModule", "root": "x"}, planned) is None
    notes = replaced_by_plan({**plain, "batch_size": 8, "num_workers": 3}, planned)
    assert notes == ["data.batch_size=8 in the data config is replaced by the plan's per-device batch of 16; to change it, set "
                     "batch.global_size (the per-device batch follows from it)"]  # fmt: skip
    with pytest.raises(UserError, match="takes neither batch_size nor global_size"):
        datamodule_kwargs({"_target_": "pytorch_lightning.LightningDataModule"}, planned)
    with pytest.raises(UserError, match=r"data.shuffle_buffer is not an argument of PlainDataModule"):
        datamodule_kwargs({**plain, "shuffle_buffer": 8}, planned)
    from plain_datamodule import PlainDataModule

    assert shards_by_rank(MNISTDataModule("x")) and not shards_by_rank(PlainDataModule("x"))


@pytest.mark.slow
def test_a_plain_user_data_module_is_sharded_under_ddp(tmp_path):
    """An ordinary LightningDataModule, named in ./conf/data/ of the folder the run starts from (as the README
    says): under 2-process DDP each rank trains on its own half of the samples."""
    import json

    from conftest import ROOT, TINY, run_cli

    (tmp_path / "conf" / "data").mkdir(parents=True)
    (tmp_path / "conf" / "data" / "plain.yaml").write_text(
        f"_target_: plain_datamodule.PlainDataModule\nrecord_dir: {tmp_path / 'seen'}\n"
    )
    args = ["data=plain", *(a for a in TINY if not a.startswith("data.")), "hardware.devices=2",
            "batch.global_size=32", "batch.num_workers=0", "trainer.limit_train_batches=null",
            f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
    result = run_cli(args, tmp_path / "run", cwd=tmp_path, PYTHONPATH=str(ROOT / "tests" / "helpers"))
    assert result.returncode == 0, result.stderr[-3000:]
    seen = [json.loads((tmp_path / "seen" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [len(s) for s in seen] == [128, 128]  # 256 samples, one epoch, half each
    assert set(seen[0]).isdisjoint(seen[1]) and set(seen[0]) | set(seen[1]) == set(range(256))


class _DividesByWorld(pl.LightningDataModule):
    """As lightning-hydra-template writes it: batch_size is the global batch, divided in `setup`."""

    def __init__(self, batch_size: int = 64) -> None:
        super().__init__()
        self.batch_size, self.per_device, self.setups = batch_size, batch_size, 0

    def setup(self, stage: str) -> None:
        self.setups += 1
        if self.trainer is not None:
            self.per_device = self.batch_size // self.trainer.world_size

    def train_dataloader(self):
        from torch.utils.data import DataLoader

        return DataLoader(range(512), batch_size=self.per_device)


class _RefusesIndivisible(_DividesByWorld):
    """lightning-hydra-template's data module: its setup refuses a batch_size the world size does not divide."""

    def setup(self, stage: str) -> None:
        if self.batch_size % self.trainer.world_size != 0:
            raise RuntimeError(f"Batch size ({self.batch_size}) is not divisible by the number of devices")
        self.per_device = self.batch_size // self.trainer.world_size


class _Doubles(_DividesByWorld):
    def setup(self, stage: str) -> None:
        self.per_device = self.batch_size * 2


class _AsksForMore(_DividesByWorld):
    def setup(self, stage: str) -> None:
        self.per_device = self.trainer.strategy.root_device  # more than a stand-in answers


def test_a_data_module_that_divides_by_the_world_size_is_given_the_global_batch(capsys, monkeypatch):
    from hydralight.data.contract import loader_batch_size, with_planned_batch

    monkeypatch.syspath_prepend(str(HELPERS))
    spec = {"_target_": f"{__name__}._DividesByWorld"}
    planned = {"batch_size": 16, "seed": 0}
    built = with_planned_batch(_DividesByWorld(16), spec, planned, world_size=4)
    assert built.batch_size == 64 and loader_batch_size(built, 4) == 16
    assert "divides batch_size by the world size itself (its loader gave 4 per device for batch_size=16), so it " \
           "is given batch_size=64" in capsys.readouterr().err  # fmt: skip
    # On one process, and for a module that uses batch_size as given, nothing changes and nothing is said.
    alone = _DividesByWorld(16)
    assert with_planned_batch(alone, spec, planned, world_size=1) is alone
    plain = {"_target_": "plain_datamodule.PlainDataModule", "record_dir": "x"}
    from plain_datamodule import PlainDataModule

    kept = PlainDataModule("x", batch_size=16)
    assert with_planned_batch(kept, plain, planned, world_size=2) is kept and kept.trainer is None
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("per_device", [3, 8])
def test_a_template_data_module_gets_the_global_batch_even_where_its_setup_refuses_the_per_device_one(
    per_device, capsys
):
    """A per-device batch of 3 on 2 processes: the template's setup refuses 3 (not divisible by 2), but is given
    the global 6 and trains on 3 per device, as planned."""
    from hydralight.data.contract import loader_batch_size, with_planned_batch

    spec = {"_target_": f"{__name__}._RefusesIndivisible"}
    built = with_planned_batch(_RefusesIndivisible(per_device), spec, {"batch_size": per_device}, world_size=2)
    assert built.batch_size == 2 * per_device and loader_batch_size(built, 2) == per_device
    said = "its setup refused it" if per_device == 3 else "its loader gave 4 per device"
    assert (
        f"divides batch_size by the world size itself ({said} for batch_size={per_device})" in capsys.readouterr().err
    )


def test_a_data_module_whose_loader_yields_another_batch_is_refused():
    from hydralight.data.contract import with_planned_batch

    with pytest.raises(UserError, match=r"was given batch_size=16 .* yields batches of 32 on each of 2 processes"):
        with_planned_batch(_Doubles(16), {"_target_": f"{__name__}._Doubles"}, {"batch_size": 16}, world_size=2)
    # A setup that needs the real trainer cannot be probed: its first batch is measured in training instead.
    asks = _AsksForMore(16)
    assert with_planned_batch(asks, {"_target_": f"{__name__}._AsksForMore"}, {"batch_size": 16}, 2) is asks


def test_a_fifo_named_like_an_image_is_left_out_of_the_prediction_source(tmp_path):
    import os

    from PIL import Image

    from hydralight.data.files import images_to_predict

    Image.new("L", (8, 8)).save(tmp_path / "a.png")
    os.mkfifo(tmp_path / "b.png")  # opening it would wait for a writer forever
    assert [path.name for path, _ in images_to_predict(str(tmp_path), ["x"])] == ["a.png"]


def test_idx_images_of_the_right_length_but_other_sizes_are_refused(tmp_path):
    from conftest import make_mnist

    root = make_mnist(tmp_path, n_train=60, n_test=20)
    raw = root / "MNIST" / "raw"
    write_idx(raw / "t10k-images-idx3-ubyte", np.zeros((20, 14, 56), dtype=np.uint8))  # 784 bytes each, as 28x28
    with pytest.raises(UserError, match=r"holds images of 14x56 where MNIST's are 28x28"):
        MNISTDataModule(str(root)).prepare_data()


class _NoLoaderOptions:
    def __init__(self, batch_size: int = 8) -> None:
        self.batch_size = batch_size


def test_a_loader_setting_the_command_line_gives_a_data_module_that_cannot_take_it_is_refused():
    """batch.drop_last=true for a data module without a drop_last argument would be ignored: one line instead."""
    from hydralight.data.contract import datamodule_kwargs

    spec = {"_target_": f"{__name__}._NoLoaderOptions"}
    planned = {"batch_size": 8, "drop_last": True, "num_workers": 0}
    assert datamodule_kwargs(spec, planned) == {"batch_size": 8}  # the plan's defaults: offered, not asked for
    with pytest.raises(UserError, match=r"batch.drop_last=true is given, but _NoLoaderOptions takes no drop_last"):
        datamodule_kwargs(spec, planned, {"drop_last": "batch.drop_last=true"})
