"""A user's code that fails. A data module whose files are not where its config says: one line naming the path,
exit code 2, and no run dir left, whether it reads them in `prepare_data` or in `setup` (inside `fit`), on 1 and
2 processes. A module that crashes in one job of a sweep: that job fails with its traceback, the others run, and
the sweep's last line counts it."""

import json

import pytest
from conftest import ROOT, one_line, run_cli, run_python

READS = """\
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class FolderData(pl.LightningDataModule):
    def __init__(self, root: str, batch_size: int = 8, in_setup: bool = False) -> None:
        super().__init__()
        self.root, self.batch_size, self.in_setup = root, batch_size, in_setup

    def prepare_data(self) -> None:
        if not self.in_setup:
            open(f"{self.root}/train.pt", "rb").close()

    def setup(self, stage: str) -> None:
        self.data = TensorDataset(torch.load(f"{self.root}/train.pt"), torch.zeros(64, dtype=torch.long))

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size)


class TorchvisionData(FolderData):  # as lightning-hydra-template reads MNIST: torchvision's, no download

    def prepare_data(self) -> None:
        if not self.in_setup:
            from torchvision.datasets import MNIST

            MNIST(self.root, train=True, download=False)

    def setup(self, stage: str) -> None:
        from torchvision.datasets import MNIST

        self.data = MNIST(self.root, train=True, download=False)
"""


@pytest.mark.slow
@pytest.mark.parametrize("processes", [[], ["hardware.devices=2", "strategy=ddp"]], ids=["1", "ddp"])
@pytest.mark.parametrize("in_setup", [False, True], ids=["prepare_data", "setup"])
@pytest.mark.parametrize("reader", ["FolderData", "TorchvisionData"])
def test_a_data_folder_that_is_not_there_is_one_line(processes, in_setup, reader, tmp_path):
    (tmp_path / "folder_data.py").write_text(READS)
    missing = tmp_path / "nowhere"
    (tmp_path / "conf" / "data").mkdir(parents=True)
    (tmp_path / "conf" / "data" / "folder.yaml").write_text(f"_target_: folder_data.{reader}\nroot: {missing}\n")
    args = ["hardware=cpu", "model._target_=pytorch_lightning.demos.boring_classes.BoringModel", "data=folder",
            f"+data.in_setup={in_setup}", "batch.global_size=8", "trainer.max_steps=2", *processes]  # fmt: skip
    run = tmp_path / "run"
    line = one_line(run_cli(args, run, cwd=tmp_path, PYTHONPATH=str(tmp_path)))
    said = (
        f"{missing}/train.pt is missing (No such file or directory"
        if reader == "FolderData"
        else ("the data set is not there (Dataset not found")
    )
    assert line.startswith(f"error: {said}") and "data.*" in line, line
    assert not run.exists()


CRASHES = """\
import pytorch_lightning as pl
from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset
from torch.utils.data import DataLoader


class Data(pl.LightningDataModule):
    def __init__(self, batch_size: int = 4) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 64), batch_size=self.batch_size)


class Crashes(BoringModel):
    def __init__(self, crash: bool = False) -> None:
        super().__init__()
        self.crash = crash

    def training_step(self, batch, batch_idx):
        if self.crash:
            raise ZeroDivisionError("the module's own bug")
        return super().training_step(batch, batch_idx)


class CrashesOnRank0(Crashes):
    def training_step(self, batch, batch_idx):
        if self.crash and self.global_rank == 0 and batch_idx == 2:
            raise ZeroDivisionError("the module's own bug, on rank 0")
        return BoringModel.training_step(self, batch, batch_idx)


class CrashesOnRank1(Crashes):
    def training_step(self, batch, batch_idx):
        if self.crash and self.global_rank == 1 and batch_idx == 2:
            raise ZeroDivisionError("the module's own bug, on rank 1")
        if not self.crash:
            import time

            time.sleep(0.5)  # the next job outlasts a watch over the failed job's ranks (it polls every 5 s)
        return BoringModel.training_step(self, batch, batch_idx)


class FailsOnRank1AsItStarts(Crashes):
    def __init__(self, crash: bool = False) -> None:
        import os

        if crash and os.environ.get("LOCAL_RANK") == "1":  # as a module whose file or data rank 1 cannot read
            raise ZeroDivisionError("the module's own bug, on rank 1 as it started")
        super().__init__(crash)


class Needs(BoringModel):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width
"""


@pytest.mark.slow
def test_a_job_that_crashes_ends_alone_and_the_sweep_counts_it(tmp_path):
    import sys

    (tmp_path / "crashes.py").write_text(CRASHES)
    sweep = tmp_path / "sweep"
    command = [sys.executable, str(ROOT / "train.py"), "-m", "hardware=cpu", "model._target_=crashes.Crashes",
               "+model.crash=true,false", "data._target_=crashes.Data", "batch.global_size=4",
               "trainer.max_steps=2", f"hydra.sweep.dir={sweep}"]  # fmt: skip
    done = run_python(command, {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert done.returncode == 1, (done.stdout[-2000:], done.stderr[-3000:])
    assert "ZeroDivisionError: the module's own bug" in done.stderr and "Error executing job" not in done.stderr
    assert "1 of 2 jobs done" in done.stdout, done.stdout[-2000:]
    failed = json.loads((sweep / "0" / "manifest.json").read_text())
    assert failed["status"] == "failed" and failed["error"] == "ZeroDivisionError: the module's own bug"
    assert json.loads((sweep / "1" / "manifest.json").read_text())["status"] == "finished"


@pytest.mark.slow
def test_a_ddp_job_whose_other_rank_crashes_ends_alone_and_the_sweep_goes_on(tmp_path):
    """Lightning's watch over the ranks killed the process that started them, the sweep's own under -m."""
    import sys

    (tmp_path / "crashes.py").write_text(CRASHES)
    sweep = tmp_path / "sweep"
    command = [sys.executable, str(ROOT / "train.py"), "-m", "hardware=cpu", "hardware.devices=2", "strategy=ddp",
               "model._target_=crashes.CrashesOnRank1", "+model.crash=true,false", "data._target_=crashes.Data",
               "batch.global_size=4", "trainer.max_steps=16", f"hydra.sweep.dir={sweep}"]  # fmt: skip
    done = run_python(command, {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert done.returncode == 1, (done.stdout[-2000:], done.stderr[-3000:])
    assert "1 of 2 jobs done" in done.stdout, (done.stdout[-2000:], done.stderr[-3000:])
    failed = json.loads((sweep / "0" / "manifest.json").read_text())
    assert failed["status"] == "failed" and failed["error"].startswith("RankFailed: rank 1 on this node failed first")
    assert "the module's own bug, on rank 1" in done.stderr  # its traceback, which the reason points at
    assert json.loads((sweep / "1" / "manifest.json").read_text())["status"] == "finished"


@pytest.mark.slow
def test_a_ddp_job_whose_first_rank_crashes_stops_the_others_at_once(tmp_path):
    """Rank 1 waits for rank 0 in a collective: the job stops it as soon as rank 0 fails, instead of waiting
    out the 120 s it gives ranks that end by themselves (a sweep's next job waited that long)."""
    import sys
    import time

    (tmp_path / "crashes.py").write_text(CRASHES)
    sweep = tmp_path / "sweep"
    command = [sys.executable, str(ROOT / "train.py"), "-m", "hardware=cpu", "hardware.devices=2", "strategy=ddp",
               "model._target_=crashes.CrashesOnRank0", "+model.crash=true,false", "data._target_=crashes.Data",
               "batch.global_size=4", "trainer.max_steps=8", f"hydra.sweep.dir={sweep}"]  # fmt: skip
    private = tmp_path / "tmp"  # the run's own temporary folder: other tests' runs meet in the shared one
    private.mkdir()
    started = time.monotonic()
    done = run_python(command, {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "TMPDIR": str(private)},
                      cwd=tmp_path)  # fmt: skip
    took = time.monotonic() - started
    assert done.returncode == 1 and "1 of 2 jobs done" in done.stdout, (done.stdout[-2000:], done.stderr[-3000:])
    failed = json.loads((sweep / "0" / "manifest.json").read_text())
    assert failed["status"] == "failed" and "the module's own bug, on rank 0" in failed["error"]
    assert took < 100, f"the sweep took {took:.0f} s: the failed job's other rank was waited for"


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_job_whose_other_rank_fails_as_it_starts_ends_at_once_and_the_sweep_goes_on(strategy, tmp_path):
    """Rank 0 waits for the others as the process group forms, in torch's C++ for 30 minutes, deaf to signals:
    a rank that failed before it got there held the job until the watch over the ranks killed the sweep."""
    import sys
    import time

    (tmp_path / "crashes.py").write_text(CRASHES)
    sweep = tmp_path / "sweep"
    command = [sys.executable, str(ROOT / "train.py"), "-m", "hardware=cpu", "hardware.devices=2",
               f"strategy={strategy}", "model._target_=crashes.FailsOnRank1AsItStarts", "+model.crash=true,false",
               "data._target_=crashes.Data", "batch.global_size=4", "trainer.max_steps=2",
               f"hydra.sweep.dir={sweep}"]  # fmt: skip
    private = tmp_path / "tmp"  # the run's own temporary folder: other tests' runs meet in the shared one
    private.mkdir()
    started = time.monotonic()
    done = run_python(command, {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "TMPDIR": str(private)},
                      cwd=tmp_path)  # fmt: skip
    took = time.monotonic() - started
    assert done.returncode == 1 and "1 of 2 jobs done" in done.stdout, (done.stdout[-2000:], done.stderr[-3000:])
    assert "the module's own bug, on rank 1 as it started" in done.stderr  # rank 1's own traceback
    failed = json.loads((sweep / "0" / "manifest.json").read_text())
    assert failed["status"] == "failed"
    assert "rank 1 of this job ended (exit code 2) before the job's ranks met" in failed["error"], failed["error"]
    assert json.loads((sweep / "1" / "manifest.json").read_text())["status"] == "finished"
    assert took < 55, f"the sweep took {took:.0f} s: the failed rank was waited for"
    assert not list(private.glob("hydralight-ranks-*")), "the ranks' meeting folder was left behind"


@pytest.mark.slow
def test_plan_true_refuses_what_the_run_would(tmp_path):
    """A loader setting the data module cannot take (batch.drop_last=true), a module's argument that nothing
    gives: refused by plan=true as by the run."""
    (tmp_path / "crashes.py").write_text(CRASHES)
    args = ["hardware=cpu", "model._target_=crashes.Crashes", "data._target_=crashes.Data", "batch.global_size=4",
            "batch.drop_last=true"]  # fmt: skip
    for extra in (["plan=true"], ["trainer.max_steps=1"]):
        line = one_line(run_cli([*args, *extra], tmp_path / "run", cwd=tmp_path, PYTHONPATH=str(tmp_path)))
        assert line.startswith("error: batch.drop_last=true is given, but Data takes no drop_last argument"), line
        assert not (tmp_path / "run").exists()
    # A module's argument without a default that nothing gives: plan=true says so as the run would.
    args = ["hardware=cpu", "model._target_=crashes.Needs", "data._target_=crashes.Data", "batch.global_size=4"]
    for extra in (["plan=true"], ["trainer.max_steps=1"]):
        line = one_line(run_cli([*args, *extra], tmp_path / "run", cwd=tmp_path, PYTHONPATH=str(tmp_path)))
        assert line.startswith("error: Needs needs width, which model does not give"), line
        assert "add +model.width=<value>" in line and not (tmp_path / "run").exists()
    followed = run_cli([*args, "+model.width=3", "plan=true"], tmp_path / "run", cwd=tmp_path, PYTHONPATH=str(tmp_path))
    assert followed.returncode == 0, followed.stderr[-2000:]  # the advice, taken as written
    # A sweep of plans where one job would be refused: said before any plan (the value checked against the
    # constructor with every other swept value), exit code 2, and nothing written.
    sweep = tmp_path / "sweep"
    planned = run_cli(["-m", *args, "+model.width=3,abc", "plan=true", f"hydra.sweep.dir={sweep}"], tmp_path,
                      cwd=tmp_path, PYTHONPATH=str(tmp_path))  # fmt: skip
    assert planned.returncode == 2 and "model.width=abc is not an integer" in planned.stderr, planned.stderr[-2000:]
    assert not sweep.exists() or not any(sweep.rglob("*.json"))


def test_an_interpolation_that_cannot_resolve_is_one_line_with_nothing_written(tmp_path):
    """An environment variable not set or a key not there in an interpolation of a user's option: one line naming
    it, exit 2, for a run, plan=true and a sweep, before any folder is made (it was a traceback and a run dir)."""
    (tmp_path / "conf" / "data").mkdir(parents=True)
    (tmp_path / "conf" / "data" / "env.yaml").write_text(
        "defaults:\n  - mnist\n  - _self_\ndata_dir: ${oc.env:HYDRALIGHT_TEST_NOT_SET}\n"
    )
    said = "data.data_dir=${oc.env:HYDRALIGHT_TEST_NOT_SET} reads the environment variable HYDRALIGHT_TEST_NOT_SET"
    for flag, extra in (([], []), ([], ["plan=true"]), (["-m"], ["seed=1,2", f"hydra.sweep.dir={tmp_path / 'sweep'}"])):
        line = one_line(run_cli([*flag, "data=env", *extra], tmp_path / "run", cwd=tmp_path))
        assert line.startswith(f"error: {said}, which is not set; set it, or give data.data_dir a value"), line
    line = one_line(run_cli(["trainer.max_steps=${paths.nope}"], tmp_path / "run", cwd=tmp_path))
    assert line == "error: trainer.max_steps=${paths.nope} names paths.nope, which is not in the config; fix the name"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conf"]
    # Hydra's own keys resolve where Hydra runs no job: printed, not a traceback.
    printed = run_cli(["--cfg", "job", "--resolve"], tmp_path / "run", cwd=tmp_path)
    assert printed.returncode == 0 and "output_dir: null" in printed.stdout, printed.stderr[-2000:]


def test_a_second_model_checkpoint_like_the_run_s_own_is_one_line_and_leaves_no_run_dir(tiny_data, tmp_path):
    """lightning-hydra-template's ModelCheckpoint (val/acc, max) added beside the run's: Lightning refused the two
    alike with a traceback, after the run dir and its records were written."""
    from conftest import TINY

    run = tmp_path / "run"
    theirs = ["+callbacks.mc._target_=pytorch_lightning.callbacks.ModelCheckpoint", "+callbacks.mc.monitor=val/acc",
              "+callbacks.mc.mode=max", "+callbacks.mc.save_last=true"]  # fmt: skip
    line = one_line(run_cli([*TINY, *theirs], run, tiny_data))
    assert "two callbacks are ModelCheckpoints with the same settings" in line, line
    assert "callbacks.model_checkpoint.KEY=" in line and not run.exists()
