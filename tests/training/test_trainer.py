"""The Trainer built from the plan: settings Lightning refuses only once it has the data are one line."""

from conftest import TINY, one_line, run_cli


def test_a_validation_interval_longer_than_the_epoch_is_one_line_and_leaves_no_run_dir(tiny_data, tmp_path):
    line = one_line(run_cli([*TINY, "trainer.val_check_interval=100"], tmp_path / "run", tiny_data))
    assert "trainer.val_check_interval=100 is more than the 4 training batches of an epoch" in line
    assert "trainer.check_val_every_n_epoch=null" in line and not (tmp_path / "run").exists()
    # The way out it names: validation counted across epochs.
    across = ["trainer.val_check_interval=6", "trainer.check_val_every_n_epoch=null", "trainer.max_epochs=2"]
    result = run_cli([*TINY, *across], tmp_path / "across", tiny_data)
    assert result.returncode == 0, result.stderr[-2000:]
    # Counted in optimizer steps when each takes several micro-batches.
    accumulated = [*TINY, "batch.max_per_device=8", "trainer.val_check_interval=100"]
    line = one_line(run_cli(accumulated, tmp_path / "acc", tiny_data))
    assert "trainer.val_check_interval=100 is more than the 4 training batches of an epoch" in line


def test_a_validation_interval_counts_optimizer_steps_whatever_the_accumulation(tiny_data, tmp_path):
    import csv

    steps = [*TINY, "trainer.limit_train_batches=null", "trainer.max_steps=12", "trainer.val_check_interval=4"]
    for name, extra in (("whole", []), ("accumulated", ["batch.max_per_device=8"])):
        result = run_cli([*steps, *extra], tmp_path / name, tiny_data)
        assert result.returncode == 0, result.stderr[-2000:]
        with (tmp_path / name / "csv" / "metrics.csv").open() as f:
            validated = [int(row["step"]) for row in csv.DictReader(f) if row.get("val/acc")]
        assert validated == [3, 7, 11], (name, validated)  # after steps 4, 8, 12 (the history counts from 0)


def test_a_taken_master_port_from_the_shell_is_replaced_in_one_line(monkeypatch, caplog):
    import socket

    from hydralight.errors import UserError
    from hydralight.training.trainer import cluster_environment

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        monkeypatch.setenv("MASTER_PORT", port)
        with caplog.at_level("WARNING"):
            environment = cluster_environment(2)
        assert (
            environment.main_port != int(port) and f"MASTER_PORT={port} from the environment is in use" in caplog.text
        )
    free = str(environment.main_port)
    assert cluster_environment(2).main_port == int(free)  # a free one stays
    monkeypatch.setenv("MASTER_PORT", "abc")
    import pytest

    with pytest.raises(UserError, match="MASTER_PORT='abc' in the environment is no port"):
        cluster_environment(2)


MANUAL = """
import pytorch_lightning as pl
import torch


class Manual(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.layer = torch.nn.Linear(784, 10)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.layer(x.flatten(1)), y)
        self.optimizers().zero_grad()
        self.manual_backward(loss)
        self.optimizers().step()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)
"""


def test_what_manual_optimization_cannot_take_is_named_by_the_user_s_own_keys(tiny_data, tmp_path):
    (tmp_path / "manual.py").write_text(MANUAL)
    args = [*TINY, "model._target_=manual.Manual"]
    for extra, said in (
        ("batch.max_per_device=8", "cannot accumulate the plan's 4 micro-batches a step: give batch.max_per_device"),
        ("trainer.gradient_clip_val=1.0", "trainer.gradient_clip_val is not applied to a module with manual"),
    ):
        line = one_line(run_cli([*args, extra], tmp_path / "run", tiny_data, cwd=tmp_path, PYTHONPATH=str(tmp_path)))
        assert said in line and "Trainer(" not in line, line
        assert not (tmp_path / "run").exists()


def test_a_download_that_fails_is_one_line_naming_why():
    # A data module that downloads (`MNIST(root, download=True)`, as the template writes it) on a machine
    # without the network: torchvision's error after every mirror, or urllib's own.
    import urllib.error

    import pytest

    from hydralight.errors import UserError
    from hydralight.training.trainer import lightning_refusals

    failures = [
        RuntimeError("Error downloading train-images-idx3-ubyte.gz:\nTried https://x/, got:\n<urlopen error down>\n"),
        urllib.error.URLError("[Errno -2] Name or service not known"),
    ]
    for failure in failures:
        with pytest.raises(UserError) as err, lightning_refusals():
            raise failure
        said = str(err.value)
        assert said.startswith("the data could not be downloaded (") and "\n" not in said
        assert said.endswith("check the path the data config gives (data.*), or put the files there")


def test_a_batch_sampler_lightning_cannot_split_over_processes_names_the_way_out():
    import pytest

    from hydralight.errors import UserError
    from hydralight.training.trainer import lightning_refusals

    with pytest.raises(UserError, match="shards_by_rank = True"), lightning_refusals():
        raise TypeError(" Lightning can't inject a (distributed) sampler into your batch sampler, because it ...")
    with pytest.raises(TypeError, match="another"), lightning_refusals():
        raise TypeError("another")  # a bug of ours or the module's keeps its traceback


def test_a_missing_file_is_blamed_on_the_data_only_when_the_data_opened_it(tmp_path):
    import pytest
    import pytorch_lightning as pl

    from hydralight.errors import UserError
    from hydralight.training.trainer import lightning_refusals

    class Data(pl.LightningDataModule):
        def setup(self, stage: str) -> None:
            open(tmp_path / "no" / "train.bin")  # noqa: SIM115

    class Module(pl.LightningModule):
        def training_step(self, batch, batch_idx):
            open(tmp_path / "no" / "side.txt")  # noqa: SIM115

    with pytest.raises(UserError) as err, lightning_refusals():
        Data().setup("fit")
    assert "train.bin is missing" in str(err.value) and "check the path the data config gives (data.*)" in str(
        err.value
    )
    with pytest.raises(UserError) as err, lightning_refusals():
        Module().training_step(None, 0)
    said = str(err.value)
    assert "side.txt is missing" in said and "opened by " in said and "Module.training_step (" in said, said
    assert "data config" not in said and "where the run reads its data" not in said, said
