from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_idx

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
