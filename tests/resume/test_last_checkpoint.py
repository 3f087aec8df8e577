"""last.ckpt at every end of training, and a run continued from it takes exactly the steps of an uninterrupted one."""

import json
import shutil
import signal
from pathlib import Path

import pytest
import torch
from conftest import HELPERS, TINY, csv_rows, one_line, run_cli

# Tiny MNIST: 500 training samples, global batch 32 -> 15 optimizer steps an epoch.
BASE = [*TINY, "trainer.limit_train_batches=null", "seed=3", "callbacks.last_checkpoint.every_n_steps=null"]


def last(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


def results(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())


def same_weights(a: Path, b: Path) -> None:
    wa, wb = last(a)["state_dict"], last(b)["state_dict"]
    assert wa.keys() == wb.keys()
    differ = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert differ == [], f"weights differ: {differ}"


def ok(result) -> None:
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])


def val_steps(run: Path) -> list[int]:
    return [int(r["step"]) for r in csv_rows(run) if r.get("val/acc")]


@pytest.mark.parametrize(
    ("budget", "step"),
    [
        (["trainer.max_steps=20", "trainer.max_epochs=5"], 20),  # a step budget, mid-epoch
        (["trainer.max_epochs=1", "trainer.limit_train_batches=4"], 4),  # a cut epoch
        (["trainer.max_epochs=1", "trainer.limit_val_batches=0"], 15),  # no validation at all
        (["trainer.max_epochs=3", "trainer.check_val_every_n_epoch=2"], 45),  # last epoch not validated
    ],
    ids=["max_steps", "limit_train_batches", "no_validation", "check_val_every_n_epoch"],
)
def test_every_end_of_training_leaves_the_final_state(tiny_data, tmp_path, budget, step):
    run = tmp_path / "run"
    ok(run_cli([*BASE, *budget], run, tiny_data))
    assert last(run)["global_step"] == results(run)["global_step"] == step
    if "trainer.limit_val_batches=0" not in budget:
        # The final weights were validated, at the final step (logged at its index, like epoch-end validations).
        assert val_steps(run)[-1] == step - 1
        assert "val/acc" in results(run)["metrics"]


@pytest.mark.slow
def test_max_time_leaves_the_final_state(tiny_data, tmp_path):
    run = tmp_path / "run"
    slow = ["+callbacks.slow._target_=slow.SlowSteps", "+callbacks.slow.seconds=0.3", "trainer.max_epochs=50"]
    ok(run_cli([*BASE, *slow, "+trainer.max_time=00:00:00:05"], run, tiny_data, PYTHONPATH=str(HELPERS)))
    step = results(run)["global_step"]
    assert 0 < step < 50 * 15 and last(run)["global_step"] == step


def test_eval_of_the_final_checkpoint_prints_the_run_s_result(tiny_data, tmp_path):
    run = tmp_path / "run"
    ok(run_cli([*BASE, "trainer.max_steps=20", "trainer.max_epochs=5"], run, tiny_data))
    evaluated = run_cli(
        [*BASE, "mode=eval", f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"], tmp_path / "eval", tiny_data
    )
    ok(evaluated)
    assert results(tmp_path / "eval")["test/acc"] == results(run)["test/acc"]
    # The tested checkpoint's callback state belongs to the run that saved it: Lightning need not say so.
    assert "dirpath has changed" not in evaluated.stdout + evaluated.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("first", "then"),
    [
        (["trainer.max_steps=7"], ["trainer.max_steps=37"]),  # mid-epoch -> mid-epoch
        (["trainer.max_steps=15"], ["trainer.max_steps=37"]),  # exactly an epoch -> mid-epoch
        (["trainer.max_epochs=1"], ["trainer.max_epochs=3"]),  # epochs -> epochs
        (["trainer.max_steps=22"], ["trainer.max_epochs=3"]),  # steps -> epochs
    ],
    ids=["mid-to-mid", "epoch-to-steps", "epochs", "steps-to-epochs"],
)
def test_a_larger_budget_continues_exactly(tiny_data, tmp_path, first, then):
    plain, extended = tmp_path / "plain", tmp_path / "extended"
    epochs = ["trainer.max_epochs=3"]
    ok(run_cli([*BASE, *epochs, *then], plain, tiny_data))
    ok(run_cli([*BASE, *epochs, *first], extended, tiny_data))
    ok(run_cli([*BASE, *epochs, *then], extended, tiny_data))
    assert results(extended)["global_step"] == results(plain)["global_step"]
    same_weights(plain, extended)
    # Each step's training loss is in the history once, with an uninterrupted run's value.
    train = lambda run: [(r["step"], r["train/loss_step"]) for r in csv_rows(run) if r.get("train/loss_step")]  # noqa: E731
    assert train(extended) == train(plain)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("before", "after"),
    [([], ["batch.max_per_device=8"]), (["batch.max_per_device=16"], ["batch.max_per_device=8"]),
     (["batch.max_per_device=8"], []), ([], ["hardware.devices=2", "strategy=ddp", "batch.max_per_device=8"])],
    ids=["1-to-4", "2-to-4", "4-to-1", "1-to-ddp-2"],
)  # fmt: skip
def test_a_run_continued_mid_epoch_under_another_accumulation_trains_the_same_steps(tiny_data, tmp_path, before, after):
    """Lightning counted the continued epoch in the micro-batches of the accumulation that saved it: under another
    one, 7 steps done then made a first step of part of a global batch and every later one across two."""
    exact = [*BASE, "model=mlp", "precision=64-true", "trainer.max_epochs=3", "hardware=cpu"]
    plain, continued = tmp_path / "plain", tmp_path / "continued"
    ok(run_cli([*exact, *after, "trainer.max_steps=20"], plain, tiny_data))
    ok(run_cli([*exact, *before, "trainer.max_steps=7"], continued, tiny_data))
    ok(run_cli([*exact, *after, "trainer.max_steps=20"], continued, tiny_data))
    wa, wb = last(plain)["state_dict"], last(continued)["state_dict"]
    worst = max(((wa[k] - wb[k]).abs().max() / wa[k].abs().max().clamp_min(1e-12)).item() for k in wa)
    assert worst < 1e-9, worst
    assert results(continued)["global_step"] == 20


KILL = [
    *TINY,
    "trainer.limit_train_batches=null",
    "trainer.max_epochs=2",
    "seed=3",
    "callbacks.last_checkpoint.every_n_steps=4",
]


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["optim=adam", "optim=adam_onecycle", "optim=sgd", "experiment=fast"])
def test_kill_9_then_resume_is_exact_for_every_optimizer_preset(tiny_data, tmp_path, preset):
    """Killed without warning two steps after a periodic save: the rerun redoes those steps identically,
    and the metric history equals an uninterrupted run's, row for row."""
    args = [*KILL, preset, "trainer.log_every_n_steps=1"]
    plain, killed = tmp_path / "plain", tmp_path / "killed"
    ok(run_cli(args, plain, tiny_data))
    kill = [
        "+callbacks.zz_kill._target_=signal_at.SignalAt",
        "+callbacks.zz_kill.step=10",
        "+callbacks.zz_kill.signum=SIGKILL",
    ]
    first = run_cli([*args, *kill], killed, tiny_data, PYTHONPATH=str(HELPERS))
    assert first.returncode == -signal.SIGKILL
    assert last(killed)["global_step"] == 8
    ok(run_cli(args, killed, tiny_data))
    same_weights(plain, killed)
    assert (killed / "csv" / "metrics.csv").read_bytes() == (plain / "csv" / "metrics.csv").read_bytes()


@pytest.mark.slow
def test_stretching_a_one_cycle_schedule_is_refused_in_one_line(tiny_data, tmp_path):
    run = tmp_path / "run"
    ok(run_cli([*BASE, "optim=adam_onecycle", "trainer.max_epochs=1"], run, tiny_data))
    # Every file of the run but its log (which tells of each attempt) stays as it was: checkpoints, history,
    # and the record that `resume=RUN_DIR` and the reports read (config, plan, manifest, Hydra's own).
    files = lambda: {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.suffix != ".log"}  # noqa: E731
    before = files()
    assert {run / "config.yaml", run / "manifest.json", run / ".hydra" / "overrides.yaml"} <= set(before)
    line = one_line(run_cli([*BASE, "optim=adam_onecycle", "trainer.max_epochs=2"], run, tiny_data))
    assert "OneCycleLR schedule of 15 steps and this run would take 30" in line and "init_from=" in line
    assert files() == before
    refused = one_line(run_cli([*BASE, "optim=adam_onecycle", "optim.lr=0.02"], run, tiny_data))
    assert "the learning rate 0.02 differs from 0.01" in refused and files() == before
    # The run continues with its own settings from its own dir (nothing to do: it is finished).
    again = run_cli([*BASE, "optim=adam_onecycle", f"resume={run}"], tmp_path / "again", tiny_data)
    assert again.returncode == 0 and "already finished" in again.stdout, again.stderr[-2000:]
    # The way out it names works: a new run from those weights with a fresh schedule.
    ok(
        run_cli(
            [*BASE, "optim=adam_onecycle", "trainer.max_epochs=2", f"init_from={run / 'checkpoints' / 'last.ckpt'}"],
            tmp_path / "fresh",
            tiny_data,
        )
    )
    assert last(tmp_path / "fresh")["global_step"] == 30


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: p.write_bytes(p.read_bytes()[:1000]),
        lambda p: p.write_bytes(b""),
        lambda p: torch.save({"weights": 1}, p),
    ],
    ids=["truncated", "empty", "another-project"],
)
def test_unreadable_last_checkpoint_names_the_file_and_the_ways_out(tiny_data, tmp_path, damage):
    run = tmp_path / "run"
    ok(run_cli(BASE, run, tiny_data))
    path = run / "checkpoints" / "last.ckpt"
    damage(path)
    broken = path.read_bytes()
    line = one_line(run_cli([*BASE, "trainer.max_epochs=2"], run, tiny_data))
    assert str(path) in line and "resume=never" in line and "move the file away" in line
    assert "ckpt_path=" in line  # the best checkpoint of the run is offered as a fallback
    assert path.read_bytes() == broken


@pytest.mark.parametrize("room", ["half a checkpoint", "two pages"])
def test_a_full_disk_keeps_the_previous_checkpoint_and_says_how_much_is_needed(tiny_data, small_disk, room):
    run = small_disk / "run"
    ok(run_cli([*BASE, "trainer.max_epochs=1"], run, tiny_data))
    path = run / "checkpoints" / "last.ckpt"
    before = path.read_bytes()
    history = (run / "csv" / "metrics.csv").read_bytes()
    ended = (run / "fit_end.json").read_bytes()
    # Leave less room than one more checkpoint needs; with two pages, too little to put the record back by
    # copies (it is put back in place).
    free = shutil.disk_usage(small_disk).free
    (small_disk / "filler").write_bytes(b"\0" * (free - (len(before) // 2 if room == "half a checkpoint" else 8192)))
    line = one_line(run_cli([*BASE, "trainer.max_epochs=2"], run, tiny_data))
    assert "no space left in" in line and str(run / "checkpoints") in line and "MiB needed" in line
    assert path.read_bytes() == before
    assert torch.load(path, weights_only=True)["global_step"] == 15
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.endswith(".tmp")]
    # The finished run's history and what its training ended with stay as they were: its test row too, which
    # results.json reports (the attempt's rows of steps it could not save go).
    assert (run / "csv" / "metrics.csv").read_bytes() == history
    assert (run / "fit_end.json").read_bytes() == ended


def test_the_final_validation_can_choose_the_best_checkpoint(tiny_data, tmp_path):
    run = tmp_path / "run"
    ok(run_cli([*BASE, "trainer.max_steps=7"], run, tiny_data))  # no epoch ends: the final validation is the only one
    best = Path(results(run)["best_checkpoint"])
    assert best.is_file() and torch.load(best, weights_only=True)["global_step"] == 7


@pytest.mark.parametrize(
    ("key", "value"), [("every_n_steps", -3), ("every_n_steps", 0), ("every_n_steps", "abc"), ("every_minutes", 0)]
)
def test_a_save_interval_out_of_range_is_one_line(tmp_path, key, value):
    from hydralight.errors import UserError
    from hydralight.resume.last_checkpoint import LastCheckpoint

    with pytest.raises(UserError, match=f"callbacks.last_checkpoint.{key}={value!r}: use a number above 0"):
        LastCheckpoint(str(tmp_path), **{key: value})
    assert LastCheckpoint(str(tmp_path), every_n_steps=None, every_minutes=None).every_n_steps is None
