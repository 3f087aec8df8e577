"""Where a run continues from, and what a continued run may change: the rules of `checkpoint.py`, through the CLI."""

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import HELPERS, ROOT, TINY, csv_rows, one_line, popen, run_cli

# Tiny MNIST: 500 training samples, global batch 32 -> 15 optimizer steps an epoch.
BASE = [*TINY, "trainer.limit_train_batches=null", "seed=5"]


def ok(result) -> None:
    assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-3000:])


def last(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


def results(run: Path) -> dict:
    return json.loads((run / "results.json").read_text())


def files(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("devices", "linked"), [(1, False), pytest.param(2, False, marks=pytest.mark.slow), (1, True)])
def test_a_copied_run_dir_is_a_run_of_its_own(tiny_data, tmp_path, devices, linked):
    original = tmp_path / "original"
    ok(run_cli([*BASE, "trainer.max_epochs=1", f"hardware.devices={devices}"], original, tiny_data))
    copy = tmp_path / "copy"
    import os
    import shutil

    # `cp -al`: the copy's files are the original's, hard-linked; what the copy's run writes must not reach them.
    shutil.copytree(original, copy, copy_function=os.link if linked else shutil.copy2)
    before = files(original)
    ok(run_cli([f"resume={copy}", "trainer.max_epochs=2"], copy, tiny_data))
    assert files(original) == before, "continuing the copy changed the original"
    assert results(copy)["global_step"] == 30 and results(copy)["best_checkpoint"].startswith(str(copy))
    assert max(int(r["step"]) for r in csv_rows(copy)) == 30
    # Its best checkpoint so far was kept in mind where it now lies: one best is left (save_top_k=1), not one
    # from before the copy that Lightning forgot beside one from after it.
    assert len([p for p in (copy / "checkpoints").glob("epoch*.ckpt")]) == 1, sorted((copy / "checkpoints").iterdir())


@pytest.mark.slow
def test_a_run_started_from_another_run_s_checkpoint_continues_from_its_own(tiny_data, tmp_path):
    source = tmp_path / "source"
    ok(run_cli([*BASE, "trainer.max_epochs=1"], source, tiny_data))
    start = f"ckpt_path={source / 'checkpoints' / 'last.ckpt'}"
    args = [*BASE, "trainer.max_epochs=3", start]
    plain, cut = tmp_path / "plain", tmp_path / "cut"
    ok(run_cli(args, plain, tiny_data))
    stop = ["+callbacks.zz_signal._target_=signal_at.SignalAt", "+callbacks.zz_signal.step=22"]
    first = run_cli([*args, *stop], cut, tiny_data, PYTHONPATH=str(HELPERS))
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-2000:]
    assert 22 <= last(cut)["global_step"] <= 23  # saved at the next step boundary
    again = run_cli(args, cut, tiny_data)  # the same command: a rerun or a requeue
    ok(again)
    assert "continuing from this run's own" in again.stdout + again.stderr
    assert results(cut)["global_step"] == results(plain)["global_step"] == 45
    a, b = last(plain)["state_dict"], last(cut)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_ctrl_c_exits_130_without_a_traceback_at_any_moment(tiny_data, tmp_path):
    """Twice in training (the second before the first is acted on: at once, not Lightning's exit code 1), and
    while the run still imports and composes (a real interpreter, not a fork of the suite's warm one)."""
    twice = ["+callbacks.zz_signal._target_=signal_at.SignalAt", "+callbacks.zz_signal.step=3",
             "+callbacks.zz_signal.signum=SIGINT", "+callbacks.zz_signal.times=2"]  # fmt: skip
    stopped = run_cli([*BASE, *twice], tmp_path / "twice", tiny_data, PYTHONPATH=str(HELPERS))
    assert stopped.returncode == 130 and "Traceback" not in stopped.stderr, stopped.stderr[-2000:]
    assert json.loads((tmp_path / "twice" / "manifest.json").read_text())["status"] == "interrupted"
    env = {**os.environ, "DATA_DIR": str(tiny_data), "HYDRALIGHT_TESTS_FRESH": "1"}
    for after_s in (0.6, 1.5, 3.0):  # from 0.6 s: past the interpreter's own start-up, still in the imports
        run = popen([sys.executable, str(ROOT / "train.py"), *BASE, f"hydra.run.dir={tmp_path / str(after_s)}"], env)
        time.sleep(after_s)
        run.send_signal(signal.SIGINT)
        output = run.communicate(timeout=120)[0]
        assert run.returncode == 130 and "Traceback" not in output, (after_s, output[-3000:])


@pytest.mark.parametrize(
    ("budget", "steps", "devices", "during"),
    [
        ("trainer.max_epochs=1", 15, 1, "validation"),  # Lightning's validation at the epoch's end
        ("trainer.max_steps=10", 10, 1, "validation"),  # the project's validation of the final weights, mid-epoch
        ("trainer.max_epochs=1", 15, 1, "train_end"),  # after the ranks' last agreement, as training ends
        pytest.param("trainer.max_epochs=1", 15, 2, "validation", marks=pytest.mark.slow),
        pytest.param("trainer.max_steps=10", 10, 2, "validation", marks=pytest.mark.slow),
        pytest.param("trainer.max_epochs=1", 15, 2, "train_end", marks=pytest.mark.slow),
    ],
)
def test_a_signal_after_the_last_step_stops_the_run_before_its_test(
    tiny_data, tmp_path, budget, steps, devices, during
):
    """Ctrl-C after the last step boundary (to rank 0 alone) is not lost: the run stops with its checkpoint and
    no test, in the final validation (the ranks agree once more as it ends) or later (the signal, held while
    training ran, is given back as training ends); the same command then tests it, as an uninterrupted run does."""
    args = [*BASE, budget, f"hardware.devices={devices}"]
    plain, cut = tmp_path / "plain", tmp_path / "cut"
    ok(run_cli(args, plain, tiny_data))
    stop = [
        "+callbacks.zz_signal._target_=signal_at.SignalAt", f"+callbacks.zz_signal.step={steps}",
        "+callbacks.zz_signal.signum=SIGINT", "+callbacks.zz_signal.rank=0", f"+callbacks.zz_signal.during={during}",
    ]  # fmt: skip
    first = run_cli([*args, *stop], cut, tiny_data, PYTHONPATH=str(HELPERS))
    assert first.returncode != 0, (first.stdout[-2000:], first.stderr[-2000:])
    assert "test/acc" not in first.stdout + first.stderr and not (cut / "results.json").exists()
    assert last(cut)["global_step"] == steps
    again = run_cli(args, cut, tiny_data)
    ok(again)
    assert results(cut)["global_step"] == results(plain)["global_step"] == steps
    assert results(cut)["test"] == results(plain)["test"]
    # The same files and history: the best checkpoint the final validation chose, the test's row at its step.
    assert Path(results(cut)["best_checkpoint"]).name == Path(results(plain)["best_checkpoint"]).name
    assert sorted(p.name for p in (cut / "checkpoints").iterdir()) == sorted(
        p.name for p in (plain / "checkpoints").iterdir()
    )
    assert [r["step"] for r in csv_rows(cut)] == [r["step"] for r in csv_rows(plain)]


def test_a_64_bit_checkpoint_is_loaded_to_the_bit_by_init_from(tiny_data, tmp_path):
    """float64 weights go into a float64 module, never through float32 (as for mode=eval and mode=predict: the
    module is made float64 before any checkpoint is loaded into it)."""
    source, tuned = tmp_path / "source", tmp_path / "tuned"
    bits = [*BASE, "trainer.precision=64-true"]
    ok(run_cli([*bits, "trainer.max_steps=3"], source, tiny_data))
    weights = last(source)["state_dict"]
    # A learning rate far below float64's resolution of these weights: one step leaves every parameter as it was.
    start = f"init_from={source / 'checkpoints' / 'last.ckpt'}"
    ok(run_cli([*bits, start, "trainer.max_steps=1", "optim.lr=1e-200"], tuned, tiny_data))
    after = last(tuned)["state_dict"]
    params = [k for k, v in weights.items() if v.is_floating_point() and "running" not in k]
    assert params and all(after[k].dtype == torch.float64 and torch.equal(after[k], weights[k]) for k in params)


@pytest.mark.slow
def test_a_changed_learning_rate_is_applied_to_the_restored_optimizer(tiny_data, tmp_path):
    run = tmp_path / "run"
    ok(run_cli([*BASE, "trainer.max_epochs=1", "optim.lr=0.001"], run, tiny_data))
    again = run_cli([*BASE, "trainer.max_epochs=2", "optim.lr=0.05"], run, tiny_data)
    ok(again)
    assert "learning rate 0.001 -> 0.05: applied to the restored optimizer" in again.stdout + again.stderr
    # The records give the new rate; when the change took effect is recorded, and carried on by the checkpoints.
    assert results(run)["learning_rate_changes"] == [{"step": 15, "from": 0.001, "to": 0.05}]
    ok(run_cli([*BASE, "trainer.max_epochs=3", "optim.lr=0.05"], run, tiny_data))
    assert results(run)["learning_rate_changes"] == [{"step": 15, "from": 0.001, "to": 0.05}]
    assert [g["lr"] for g in last(run)["optimizer_states"][0]["param_groups"]] == [0.05]
    assert last(run)["hyper_parameters"]["lr"] == 0.05
    assert json.loads((run / "ranks" / "rank0.json").read_text())["lr"] == 0.05


def test_a_changed_learning_rate_under_a_schedule_is_refused(tiny_data, tmp_path):
    run = tmp_path / "run"
    ok(run_cli([*BASE, "optim=sgd", "trainer.max_epochs=1"], run, tiny_data))
    line = one_line(run_cli([*BASE, "optim=sgd", "trainer.max_epochs=1", "optim.lr=0.5"], run, tiny_data))
    assert "differs from" in line and "init_from=" in line


def test_another_optimizer_setting_is_refused_naming_the_key(tiny_data, tmp_path):
    run = tmp_path / "run"
    ok(run_cli([*BASE, "trainer.max_epochs=1"], run, tiny_data))
    line = one_line(run_cli([*BASE, "trainer.max_epochs=2", "optim.optimizer.weight_decay=0.1"], run, tiny_data))
    assert "optim.optimizer differs" in line and "weight_decay=0.1" in line


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("seed=7", "seed=7 differs from the seed"),  # it draws the data split: former validation images would train
        ("data.val_size=50", "data.val_size differs from the one"),
        ("objective.direction=min", "objective min val/acc differs from the one"),
    ],
)
def test_what_the_data_or_the_best_checkpoint_depend_on_cannot_change_when_continuing(tiny_data, tmp_path, change,
                                                                                      said):  # fmt: skip
    run = tmp_path / "run"
    ok(run_cli([*BASE, "trainer.max_epochs=1"], run, tiny_data))
    before = files(run)
    line = one_line(run_cli([*BASE, "trainer.max_epochs=2", change], run, tiny_data))
    assert said in line and "another run dir" in line, line
    assert files(run) == before  # refused before anything was written


def test_a_fresh_start_never_replaces_a_finished_run(tiny_data, tmp_path):
    run = tmp_path / "run"
    ok(run_cli([*BASE, "trainer.max_epochs=1"], run, tiny_data))
    before = files(run)
    line = one_line(run_cli([*BASE, "trainer.max_epochs=1", "resume=never"], run, tiny_data))
    assert "resume=never starts a new run, but" in line and "holds a finished one" in line, line
    assert files(run) == before
    # The way out a refused continuation names starts a new run in a new dir, the finished one left as it was.
    line = one_line(run_cli([*BASE, "trainer.max_epochs=2", "batch.global_size=16"], run, tiny_data))
    assert f"init_from={run / 'checkpoints'}" in line and "resume=never" not in line, line
    ok(run_cli([*BASE, "trainer.max_epochs=1", "batch.global_size=16", f"init_from={run / 'checkpoints' / 'last.ckpt'}"],
               tmp_path / "new", tiny_data))  # fmt: skip
    assert files(run) == before


@pytest.mark.slow
def test_another_batch_size_is_refused_and_init_from_fine_tunes_with_it(tiny_data, tmp_path):
    run = tmp_path / "run"
    ok(run_cli([*BASE, "trainer.max_epochs=1", "trainer.max_steps=10"], run, tiny_data))
    line = one_line(run_cli([*BASE, "trainer.max_epochs=1", "batch.global_size=16"], run, tiny_data))
    assert "global batch of 32" in line and "init_from=" in line
    tuned = tmp_path / "tuned"
    weights = run / "checkpoints" / "last.ckpt"
    ok(run_cli([*BASE, "trainer.max_epochs=1", "batch.global_size=16", f"init_from={weights}"], tuned, tiny_data))
    assert results(tuned)["global_step"] == 500 // 16  # a fresh step count and schedule
    # It started from those weights: its first loss is the source run's last, not a random network's.
    first_loss = lambda r: float(next(x["train/loss_step"] for x in csv_rows(r) if "train/loss_step" in x))  # noqa: E731
    assert first_loss(tuned) < first_loss(run)


@pytest.mark.slow
def test_rerunning_a_finished_run_is_a_no_op_and_a_larger_budget_continues(tiny_data, tmp_path):
    run = tmp_path / "run"
    args = [*BASE, "trainer.max_epochs=2"]
    ok(run_cli(args, run, tiny_data))
    before = files(run)
    again = run_cli(args, run, tiny_data)
    ok(again)
    assert f"already finished: test/acc={results(run)['test/acc']}" in again.stdout
    assert files(run) == before  # every byte, its log's too
    ok(run_cli([*BASE, "trainer.max_epochs=3"], run, tiny_data))
    kept = sorted(p.name for p in (run / "checkpoints").glob("*.ckpt"))
    assert len(kept) == 2 and "last.ckpt" in kept, kept  # save_top_k=1 holds across attempts
    assert results(run)["global_step"] == 45 and Path(results(run)["best_checkpoint"]).is_file()


def test_limit_train_batches_counts_optimizer_steps_whatever_the_accumulation(tiny_data, tmp_path):
    for name, extra in (("whole", []), ("accumulated", ["batch.max_per_device=8"])):
        ok(run_cli([*TINY, "trainer.limit_train_batches=5", *extra], tmp_path / name, tiny_data))
        assert results(tmp_path / name)["global_step"] == 5, name
    a, b = last(tmp_path / "whole")["state_dict"], last(tmp_path / "accumulated")["state_dict"]
    worst = max(((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-12)).item() for k in a)
    assert worst < 1e-4


def test_a_validation_split_that_leaves_too_little_to_train_is_one_line(tiny_data, tmp_path):
    line = one_line(run_cli([*TINY, "data.val_size=590"], tmp_path / "run", tiny_data))
    assert "data.val_size=590" in line and not (tmp_path / "run").exists()


def test_a_quoted_run_dir_with_spaces(tiny_data, tmp_path):
    run = tmp_path / "with space"
    result = run_cli([*TINY, f'hydra.run.dir="{run}"'], run, tiny_data)
    ok(result)
    assert (run / "results.json").is_file()
    assert not list(Path(tmp_path).glob('"*'))


def test_eval_records_the_network_it_evaluated(tiny_data, tmp_path):
    run = tmp_path / "run"
    ok(run_cli(TINY, run, tiny_data))  # model=mlp
    evaluated = tmp_path / "eval"
    ok(
        run_cli(
            ["hardware=cpu", "data.val_size=100", "mode=eval", f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"],
            evaluated,
            tiny_data,
        )
    )
    assert "MLP" in (evaluated / "config.yaml").read_text() and "SeedCNN" not in (evaluated / "config.yaml").read_text()


def test_eval_of_a_run_whose_best_checkpoint_is_damaged_names_it_and_another(tiny_data, tmp_path):
    """`mode=eval resume=RUN` reads the checkpoint the run's results name: damaged, the line says it is the run's
    best (not a ckpt_path= the user never gave) and which other of its checkpoints to test instead."""
    run = tmp_path / "run"
    ok(run_cli(TINY, run, tiny_data))
    best = Path(results(run)["best_checkpoint"])
    assert best.name != "last.ckpt"
    best.write_bytes(best.read_bytes()[:1000])
    line = one_line(run_cli([*TINY, "mode=eval", f"resume={run}"], tmp_path / "unused", tiny_data))
    assert line.startswith(f"error: the run's best checkpoint {best} is not a checkpoint"), line
    last = run / "checkpoints" / "last.ckpt"
    assert line.endswith(f"test another of its checkpoints: ckpt_path={last} in place of resume="), line
    ok(run_cli([*TINY, "mode=eval", f"ckpt_path={last}"], tmp_path / "other", tiny_data))  # the advice, as written


def test_eval_takes_the_training_command_and_refuses_another_model_or_a_second_starting_point(tiny_data, tmp_path):
    run = tmp_path / "run"
    ok(run_cli(TINY, run, tiny_data))  # model=mlp
    last = run / "checkpoints" / "last.ckpt"
    ok(run_cli([*TINY, "mode=eval", f"ckpt_path={last}"], tmp_path / "same", tiny_data))  # the same model: fine
    other = one_line(run_cli([*TINY, "model=cnn", "mode=eval", f"ckpt_path={last}"], tmp_path / "cnn", tiny_data))
    assert "model.net differs: model=cnn" in other and f"init_from={last}" in other
    no_model = [a for a in TINY if not a.startswith("model=")]
    preset = one_line(run_cli([*no_model, "experiment=fast", "mode=eval", f"ckpt_path={last}"], tmp_path / "fast",
                              tiny_data))  # fmt: skip
    assert "differs: experiment=fast" in preset, preset
    smoothing = one_line(run_cli([*TINY, "mode=eval", f"ckpt_path={last}", "model.label_smoothing=0.2"],
                                 tmp_path / "smooth", tiny_data))  # fmt: skip
    assert "model.label_smoothing differs: model.label_smoothing=0.2" in smoothing
    both = one_line(run_cli([*TINY, f"init_from={last}", f"ckpt_path={last}"], tmp_path / "both", tiny_data))
    assert "are both given; keep one" in both
    unused = one_line(
        run_cli([*TINY, "mode=eval", f"ckpt_path={last}", f"init_from={last}"], tmp_path / "x", tiny_data)
    )
    assert "init_from would be ignored" in unused
    assert not any((tmp_path / name).exists() for name in ("cnn", "fast", "smooth", "both", "x"))


def test_a_resumed_attempt_reports_its_own_throughput(tiny_data, tmp_path):
    run = tmp_path / "run"
    ok(run_cli([*BASE, "trainer.max_epochs=1"], run, tiny_data))
    first = results(run)
    ok(run_cli([*BASE, "trainer.max_epochs=2"], run, tiny_data))
    second = results(run)
    # 15 more steps of 32 samples in the second attempt's own time, not 30 steps.
    assert second["samples_per_second"] == pytest.approx(15 * 32 / second["fit_seconds"], rel=0.01)
    assert first["global_step"] == 15 and second["global_step"] == 30


def test_no_checkpoint_callbacks_means_no_checkpoint_files(tiny_data, tmp_path):
    run = tmp_path / "run"
    ok(run_cli([*TINY, "callbacks=none"], run, tiny_data))
    assert not list(run.rglob("*.ckpt"))


@pytest.mark.slow
def test_budgets_do_what_the_user_said(tiny_data, tmp_path):
    run = tmp_path / "run"
    common = [arg for arg in BASE if not arg.startswith("trainer.max_epochs")]
    ok(run_cli([*common, "trainer.max_steps=20"], run, tiny_data))  # 15 steps an epoch: the epoch default binds not
    assert results(run)["global_step"] == 20 and results(run)["stopped_by"] is None
    before = files(run)
    # A finished run continued by its dir with nothing else said: its saved budget stands.
    again = run_cli([f"resume={run}"], tmp_path / "elsewhere", tiny_data)
    ok(again)
    assert "already finished" in again.stdout and files(run) == before
    ok(run_cli([f"resume={run}", "trainer.max_steps=40"], tmp_path / "elsewhere", tiny_data))
    assert results(run)["global_step"] == 40
    # Both budgets given: the one that ends the run first is named in the result line and results.json.
    both = tmp_path / "both"
    done = run_cli([*common, "trainer.max_epochs=1", "trainer.max_steps=40"], both, tiny_data)
    ok(done)
    assert "stopped by trainer.max_epochs=1 at step 15, before trainer.max_steps=40" in done.stdout
    assert results(both)["stopped_by"] == {"budget": "trainer.max_epochs=1", "before": ["trainer.max_steps=40"]}
    # A longer step budget that the epochs still cut: nothing to train, and the records stay as they were.
    before = files(both)
    line = one_line(run_cli([*common, "trainer.max_epochs=1", "trainer.max_steps=60"], both, tiny_data))
    assert "nothing to train" in line and "trainer.max_epochs=1" in line
    assert files(both) == before  # every byte, its log's too
    # Another change than the budget (a harmless one): the same refusal, which says how to run it anew too.
    line = one_line(run_cli([*common, "trainer.max_epochs=1", "trainer.max_steps=40", "+notes.x=1"], both, tiny_data))
    assert "nothing to train" in line and "give this changed config a run dir of its own (hydra.run.dir=DIR)" in line
    assert files(both) == before


def test_a_checkpoint_path_that_is_no_checkpoint_file_is_one_line(tiny_data, tmp_path):
    run = tmp_path / "run"
    ok(run_cli([*BASE, "trainer.max_steps=2"], run, tiny_data))
    (tmp_path / "garbage.ckpt").write_bytes(bytes(range(256)) * 8)
    (tmp_path / "text.ckpt").write_text("hello")
    cases = {
        "/dev/null": "is not a regular file",
        str(run): f"is a folder; pass a .ckpt file (a run dir's is {run / 'checkpoints' / 'last.ckpt'})",
        str(tmp_path / "garbage.ckpt"): "is not a checkpoint of this project (not a file torch.save writes)",
        str(tmp_path / "text.ckpt"): "is not a checkpoint of this project (not a file torch.save writes)",
        str(tmp_path / "missing.ckpt"): "does not exist",
    }
    for i, (path, says) in enumerate(cases.items()):
        for key in ("ckpt_path", "init_from"):
            line = one_line(run_cli([*BASE, f"{key}={path}"], tmp_path / f"new-{i}-{key}", tiny_data))
            assert says in line and "mmap" not in line, line
            assert not (tmp_path / f"new-{i}-{key}").exists()
        line = one_line(run_cli(["mode=eval", f"ckpt_path={path}", "data.val_size=100"], tmp_path / "eval", tiny_data))
        assert says in line, line


@pytest.mark.slow
def test_nothing_to_train_on_two_processes_is_one_line_from_one_rank(tiny_data, tmp_path):
    run = tmp_path / "run"
    two = [*BASE, "trainer.max_epochs=1", "hardware.devices=2", "strategy=ddp"]
    ok(run_cli(two, run, tiny_data))
    before = files(run)
    refused = run_cli([*two, "trainer.max_steps=100"], run, tiny_data)
    line = one_line(refused)
    assert "nothing to train" in line and (refused.stdout + refused.stderr).count("error:") == 1, refused.stderr
    assert "Traceback" not in refused.stderr and files(run)["results.json"] == before["results.json"]


@pytest.mark.slow
def test_a_continued_run_is_written_into_its_own_dir_alone(tiny_data, tmp_path):
    """`resume=RUN_DIR hydra.run.dir=OTHER`: the run, Hydra's log with it, continues in RUN_DIR (said in a note);
    OTHER is never made, and the first attempt's record of Hydra stays as it was."""
    run, other = tmp_path / "run", tmp_path / "other"
    ok(run_cli([*BASE, "trainer.max_steps=3"], run, tiny_data))
    record = {name: data for name, data in files(run).items() if name.startswith(".hydra/")}
    logged = (run / "train.log").read_text()
    again = run_cli([f"resume={run}", "trainer.max_steps=6"], other, tiny_data)
    ok(again)
    assert f"note: resume={run} continues that run in its own dir; hydra.run.dir={other} is not used" in again.stderr
    assert not other.exists() and results(run)["global_step"] == 6
    assert {name: data for name, data in files(run).items() if name.startswith(".hydra/")} == record
    assert (run / "train.log").read_text().startswith(logged) and len((run / "train.log").read_text()) > len(logged)


def test_eval_of_a_run_dir_tests_its_best_checkpoint_in_a_run_dir_of_its_own(tiny_data, tmp_path):
    run = tmp_path / "run"
    ok(run_cli(TINY, run, tiny_data))
    before = files(run)
    evaluated = tmp_path / "eval"
    ok(run_cli([*TINY, "mode=eval", f"resume={run}"], evaluated, tiny_data))
    assert results(evaluated)["metrics"]["test/acc"] == results(run)["metrics"]["test/acc"]
    assert files(run) == before  # the run it read is left as it was
    both = one_line(run_cli([*TINY, "mode=eval", f"resume={run}", f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"],
                            tmp_path / "both", tiny_data))  # fmt: skip
    assert "both name the checkpoint to test; keep one" in both
    into = one_line(run_cli([*TINY, "mode=eval", f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"], run, tiny_data))
    assert "mode=eval writes into a new run dir" in into and files(run) == before


@pytest.mark.parametrize(("signum", "code"), [("SIGINT", 130), ("SIGUSR1", 143), ("SIGUSR2", 143)])
def test_a_stop_or_warning_signal_saves_and_exits_with_its_code(signum, code, tiny_data, tmp_path):
    # SIGUSR1 is Lightning's warning signal (a user's --signal=USR1@90): it killed the run unsaved. Outside a
    # SLURM job a warning cannot requeue, so the run stops as SIGTERM stops it; Ctrl-C exits 130, as shells expect.
    run = tmp_path / "run"
    stop = ["+callbacks.zz_signal._target_=signal_at.SignalAt", "+callbacks.zz_signal.step=3",
            f"+callbacks.zz_signal.signum={signum}"]  # fmt: skip
    result = run_cli([*BASE, "trainer.max_steps=8", *stop], run, tiny_data, PYTHONPATH=str(HELPERS))
    assert result.returncode == code, (result.stdout[-2000:], result.stderr[-2000:])
    # Sent in a callback's hook at step 3, before that step's end: saved as the step ends.
    assert last(run)["global_step"] == 3 and not (run / "results.json").exists()


def test_a_trainer_setting_changed_on_continuing_is_said_and_kept_per_attempt(tiny_data, tmp_path):
    """A precision or gradient clipping changed on continuing in the run's own dir trained on without a word, and
    config.yaml then said the run had it from step 0."""
    run = tmp_path / "run"
    args = [*BASE, "optim=adam", "trainer.max_epochs=3"]
    ok(run_cli([*args, "trainer.max_steps=5"], run, tiny_data))
    done = run_cli([*args, "trainer.max_steps=10", "trainer.gradient_clip_val=0.5"], run, tiny_data)
    ok(done)
    assert "note: this continuation trains on with trainer.gradient_clip_val None -> 0.5;" in done.stderr
    changes = json.loads((run / "manifest.json").read_text())["trainer_changes"]
    assert changes == [{"setting": "trainer.gradient_clip_val", "was": None, "now": 0.5}]
    assert results(run)["global_step"] == 10
