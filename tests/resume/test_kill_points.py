"""A kill without warning (SIGKILL) at every moment of a run, then the same command (or a larger budget):
the run ends as an uninterrupted one does, with its weights, its results and its metric history row for row.

| kill point | where | table id |
|---|---|---|
| inside an epoch | two steps after a periodic save | `step` |
| while saving | last.ckpt built, not yet written | `save` |
| at an epoch's end | after its last step, before its checkpoint | `epoch_end` |
| in an epoch-end validation | validation of step 15 | `validation` |
| in a validation inside an epoch | validation of step 8, where a periodic save is due | `mid_epoch_validation` |
| in the final validation | validation of the last step | `final_validation` |
| in the test stage | a test batch done | `test` |
| while recording | test done, results.json not written | `records` |
| as training ends | final checkpoint written, `fit` not returned (also after a step budget) | `fit_end` |
| in the test of a run a step budget ended | a test batch done | `test_of_a_step_budget` |
| then a larger budget | a kill in the test, continued with more epochs | `test_then_more_epochs` |
| a whole epoch, then a larger max_steps | no kill: the budget grows at the boundary | `epoch_then_max_steps` |
| between the jobs of a sweep | job 0 done, job 1 starting | the sweep test below |
"""

import json
import signal
from pathlib import Path

import pytest
import torch
from conftest import HELPERS, TINY, run_cli

BASE = [
    *TINY,
    "trainer.limit_train_batches=null",  # 15 steps an epoch
    "trainer.max_epochs=2",
    "seed=3",
    "callbacks.last_checkpoint.every_n_steps=4",
]

# id: (kill point and its arguments, overrides of the first attempt, overrides of the rerun and the plain run)
POINTS = {
    "step": (["point=step", "step=10"], [], []),
    "save": (["point=save", "step=8"], [], []),
    "epoch_end": (["point=epoch_end", "epoch=0"], [], []),
    "validation": (["point=validation", "step=15"], [], []),
    # A periodic save due at a step that validates: saved before that validation, Lightning skipped it after.
    "mid_epoch_validation": (
        ["point=validation", "step=8"],
        ["trainer.val_check_interval=4"],
        ["trainer.val_check_interval=4"],
    ),  # fmt: skip
    "final_validation": (["point=validation", "step=30"], [], []),
    "test": (["point=test"], [], []),
    "records": (["point=records"], [], []),
    "test_then_more_epochs": (["point=test"], [], ["trainer.max_epochs=3"]),
    # Training done, `fit` not yet returned: what it ended with is in its final checkpoint only.
    "fit_end": (["point=fit_end"], [], []),
    # A step budget ends training mid-epoch: the epoch count, the stop and the test's row are those it ended with.
    "fit_end_of_a_step_budget": (["point=fit_end"], ["trainer.max_steps=20"], ["trainer.max_steps=20"]),
    "test_of_a_step_budget": (["point=test"], ["trainer.max_steps=20"], ["trainer.max_steps=20"]),
    "epoch_then_max_steps": (
        ["point=none"],
        ["trainer.max_epochs=1"],
        ["trainer.max_epochs=3", "trainer.max_steps=37"],
    ),
}


def killer(point: list[str], once: Path) -> list[str]:
    return ["+callbacks.zz_kill._target_=kill_at.KillAt", f"+callbacks.zz_kill.once={once}"] + [
        f"+callbacks.zz_kill.{arg}" for arg in point
    ]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


def results(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())


def assert_same_run(plain: Path, continued: Path) -> None:
    a, b = weights(plain), weights(continued)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "weights differ"
    ra, rb = results(plain), results(continued)
    for key in ("global_step", "epochs", "test", "objective", "metrics", "best_checkpoint"):
        value = ra[key].replace(str(plain), str(continued)) if key == "best_checkpoint" else ra[key]
        assert rb[key] == value, key
    # An attempt that trained nothing reports the throughput of the one that did, not its steps over no time.
    assert rb["train_samples_per_second"] and rb["samples_per_second"]
    assert rb["samples_per_second"] < 5 * ra["samples_per_second"], (ra["samples_per_second"], rb["samples_per_second"])
    # Every step once, each value as the uninterrupted run logged it.
    assert (continued / "csv" / "metrics.csv").read_bytes() == (plain / "csv" / "metrics.csv").read_bytes()
    manifest = json.loads((continued / "manifest.json").read_text())
    assert manifest["status"] == "finished"


@pytest.mark.slow
@pytest.mark.parametrize("case", list(POINTS))
def test_a_kill_at_any_point_continues_as_an_uninterrupted_run(tiny_data, tmp_path, case):
    point, first, then = POINTS[case]
    plain, killed = tmp_path / "plain", tmp_path / "killed"
    (tmp_path / "fired").write_text("")  # the plain run carries the same callback, which never fires
    env = {"PYTHONPATH": str(HELPERS)}
    done = run_cli([*BASE, *then, *killer(point, tmp_path / "fired")], plain, tiny_data, **env)
    assert done.returncode == 0, done.stderr[-2000:]
    cut = run_cli([*BASE, *first, *killer(point, tmp_path / "once")], killed, tiny_data, **env)
    expected = 0 if point == ["point=none"] else -signal.SIGKILL
    assert cut.returncode == expected, cut.stderr[-2000:]
    again = run_cli([*BASE, *then, *killer(point, tmp_path / "once")], killed, tiny_data, **env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "Traceback" not in again.stderr
    assert_same_run(plain, killed)


@pytest.mark.slow
def test_a_sweep_killed_between_its_jobs_continues_each_job_once(tiny_data, tmp_path):
    """The same `-m` command again: the finished job is not run again, the next one runs from its start."""
    plain, killed = tmp_path / "plain", tmp_path / "killed"
    (tmp_path / "fired").write_text("")
    env = {"PYTHONPATH": str(HELPERS)}
    point = ["point=next_job", f"job={killed / '0'}"]
    sweep = lambda once, folder: ["-m", *BASE, "seed=1,2", *killer(point, once), f"hydra.sweep.dir={folder}"]  # noqa: E731
    assert run_cli(sweep(tmp_path / "fired", plain), plain, tiny_data, **env).returncode == 0
    cut = run_cli(sweep(tmp_path / "once", killed), killed, tiny_data, **env)
    assert cut.returncode == -signal.SIGKILL and not (killed / "1" / "results.json").exists()
    finished = (killed / "0" / "results.json").read_bytes()
    again = run_cli(sweep(tmp_path / "once", killed), killed, tiny_data, **env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "already finished" in again.stdout + again.stderr
    assert (killed / "0" / "results.json").read_bytes() == finished  # job 0 was not run again
    for job in ("0", "1"):
        assert_same_run(plain / job, killed / job)
