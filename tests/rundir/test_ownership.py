"""A folder the project did not make is the user's: refused before anything is written there, never deleted.
A refused run removes only what its own attempt added."""

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TINY, one_line, run_cli, run_python

from hydralight.errors import UserError
from hydralight.rundir.ownership import Claim, check_usable, claim_sweep_dir, foreign_entries, is_project_dir

# Refused at the first validation of the plan, after the run dir was taken.
REFUSED_LATE = [*TINY, "trainer.max_steps=2", "objective.metric=val/no_such", "logger=csv"]


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry below `folder`: a file's digest, a link's target, a folder's name."""
    found = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        if path.is_symlink():
            found[key] = "link:" + str(path.readlink())
        elif path.is_file():
            found[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[key] = "dir"
    return found


def users_folder(tmp_path: Path) -> Path:
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("my notes\n")
    (mine / "sub" / "data.csv").write_text("a,b\n1,2\n")
    # Names the project writes itself, of the user's own: overwritten before.
    (mine / "config.yaml").write_text("mine: true\n")
    (mine / "results.json").write_text('{"mine": 1}\n')
    return mine


def test_a_new_folder_is_made_and_marked_and_removed_when_nothing_was_written(tmp_path):
    claim = Claim.take(tmp_path / "a" / "b" / "run")
    assert claim.made_folder and is_project_dir(claim.path) and claim.before == frozenset()
    assert claim.remove_if_empty() and not (tmp_path / "a").exists()


def test_an_empty_folder_is_used_but_never_removed(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    claim = Claim.take(empty)
    assert not claim.made_folder
    (empty / "config.yaml").write_text("x")
    claim.discard_added()
    assert empty.is_dir() and list(empty.iterdir()) == []
    # Taken again later: still known as a folder the user had.
    claim = Claim.take(empty)
    (empty / "manifest.json").write_text("{}")
    assert not Claim.take(empty).made_folder


def test_a_folder_of_the_users_is_refused_untouched(tmp_path):
    mine = users_folder(tmp_path)
    before = snapshot(mine)
    with pytest.raises(UserError, match=r"already holds files this project did not write \(config.yaml, notes"):
        Claim.take(mine)
    assert snapshot(mine) == before


def test_what_was_there_before_stays_when_an_attempt_is_discarded(tmp_path):
    run = tmp_path / "run"
    first = Claim.take(run)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    again = Claim.take(run)
    assert again.made_folder and "checkpoints" in again.before
    (run / "csv").mkdir()
    again.discard_added()
    assert (run / "checkpoints" / "last.ckpt").read_bytes() == b"weights" and not (run / "csv").exists()
    assert first.path == again.path


def test_a_link_in_place_of_the_marker_is_not_followed(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    run = tmp_path / "run"
    run.mkdir()
    (run / ".hydralight").symlink_to(outside)
    with pytest.raises(UserError, match=r"already holds files this project did not write \(\.hydralight\)"):
        check_usable(run, "hydra.run.dir")
    assert outside.read_text() == "keep me"


def test_a_folder_of_the_users_with_links_of_its_own_is_refused_as_the_users_not_told_to_drop_them(tmp_path):
    """A project's own folder as the run dir (its package links its config): the line told the user to remove
    that link; the folder is not the run's to use, whatever links it holds."""
    project = tmp_path / "project"
    (project / "conf").mkdir(parents=True)
    (project / "src" / "pkg").mkdir(parents=True)
    (project / "src" / "pkg" / "conf").symlink_to("../../conf")
    (project / "README.md").write_text("mine")
    with pytest.raises(UserError) as refused:
        check_usable(project, "hydra.run.dir")
    said = str(refused.value)
    assert "already holds files this project did not write (README.md, conf, src)" in said and "link" not in said
    assert (project / "src" / "pkg" / "conf").is_symlink()


def test_hydras_own_record_is_not_the_users(tmp_path):
    job = tmp_path / "0"
    (job / ".hydra").mkdir(parents=True)
    (job / "train.log").write_text("")
    assert foreign_entries(job, hydra_wrote=True) == []
    assert foreign_entries(job) == [".hydra", "train.log"]
    claim = Claim.take(job, hydra_wrote=True)
    assert claim.made_folder and claim.before == frozenset()


def test_a_hard_linked_copy_of_a_run_dir_gets_files_of_its_own_when_taken(tmp_path):
    original, copy = tmp_path / "original", tmp_path / "copy"
    (original / "checkpoints").mkdir(parents=True)
    (original / ".hydralight").write_text('{"by": "hydralight", "made_folder": true}')
    (original / "train.log").write_text("first attempt\n")
    (original / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    shutil.copytree(original, copy, copy_function=os.link)  # `cp -al`
    Claim.take(copy)
    with (copy / "train.log").open("a") as log:  # what Hydra's log handler does on the next attempt
        log.write("second attempt\n")
    assert (original / "train.log").read_text() == "first attempt\n"
    assert (copy / "checkpoints" / "last.ckpt").read_bytes() == b"weights"
    assert all(p.stat().st_nlink == 1 for p in original.rglob("*") if p.is_file())
    assert sorted(p.name for p in copy.rglob("*")) == sorted(p.name for p in original.rglob("*"))


def test_a_run_and_a_sweep_never_share_a_folder(tmp_path):
    run, sweep = tmp_path / "run", tmp_path / "sweep"
    Claim.take(run)
    (run / "config.yaml").write_text("seed: 1\n")
    with pytest.raises(UserError, match="holds a run of this project; a sweep goes into a dir of its own"):
        claim_sweep_dir(run)
    assert not (run / "multirun.yaml").exists()
    claim_sweep_dir(sweep)
    with pytest.raises(UserError, match="is the dir of a sweep of this project; a run goes into a dir of its own"):
        Claim.take(sweep)
    # A sweep dir of an earlier version, known by Hydra's record of it.
    (tmp_path / "older").mkdir()
    (tmp_path / "older" / "multirun.yaml").write_text("hydra: {}\n")
    with pytest.raises(UserError, match="is the dir of a sweep"):
        check_usable(tmp_path / "older", "hydra.run.dir")
    Claim.take(sweep / "0")  # its jobs' dirs are runs of their own
    (sweep / ".hydralight-report.json").write_text("{}")  # a report's record of its files: the sweep's own
    claim_sweep_dir(sweep)


def test_a_file_is_no_run_dir(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is a file, not a folder"):
        check_usable(tmp_path / "file", "hydra.run.dir")


@pytest.mark.slow
def test_refused_runs_leave_every_user_file_as_it_was(tiny_data, tmp_path):
    mine = users_folder(tmp_path)
    package_copy = tmp_path / "package"
    shutil.copytree(ROOT / "src" / "hydralight", package_copy)
    project = tmp_path / "project"
    project.mkdir()
    (project / "train_mine.py").write_text("print('mine')\n")
    cases = [(mine, REFUSED_LATE), (package_copy, REFUSED_LATE), (mine, TINY)]
    for folder, args in cases:
        before = snapshot(folder)
        line = one_line(run_cli(args, folder, tiny_data))
        assert "already holds files this project did not write" in line, line
        assert snapshot(folder) == before
    # `hydra.run.dir=.` from the user's own project folder, and `plan=true` there.
    for args in ([*REFUSED_LATE, "hydra.run.dir=."], [*TINY, "plan=true", "hydra.run.dir=."]):
        before = snapshot(project)
        line = one_line(run_cli(args, project, tiny_data, cwd=project))
        assert "already holds files" in line and snapshot(project) == before


@pytest.mark.slow
def test_a_refused_run_in_an_empty_folder_leaves_it_empty_and_a_new_one_leaves_nothing(tiny_data, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "val/no_such" in one_line(run_cli(REFUSED_LATE, empty, tiny_data))
    assert empty.is_dir() and list(empty.iterdir()) == []
    assert "val/no_such" in one_line(run_cli(REFUSED_LATE, tmp_path / "new" / "deep", tiny_data))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


@pytest.mark.slow
def test_an_interpolated_run_dir_name_is_resolved_before_anything_is_made(tiny_data, tmp_path):
    result = run_cli([*TINY, "trainer.max_steps=2", f"hydra.run.dir={tmp_path}/${{now:%Y}}-run"], tmp_path, tiny_data)
    assert result.returncode == 0, result.stderr[-2000:]
    (made,) = tmp_path.iterdir()
    assert "$" not in made.name and (made / "results.json").is_file()


@pytest.mark.parametrize("inside", ["manifest.json", "results.json", "csv/metrics.csv", "checkpoints/last.ckpt"])
def test_a_link_out_of_a_run_dir_is_refused_before_anything_is_written(tmp_path, inside):
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me\n")
    run = Claim.take(tmp_path / "run").path  # a run dir of this project, someone's link put in it
    (run / inside).parent.mkdir(parents=True, exist_ok=True)
    (run / inside).symlink_to(outside)
    with pytest.raises(UserError, match=f"holds {inside}, a link to {outside} \\(outside the run dir\\)"):
        Claim.take(run)
    assert outside.read_text() == "keep me\n"
    # A link to a file of the user's in the run dir itself would be written through as well.
    (run / inside).unlink()
    (run / "notes.txt").write_text("my notes\n")
    (run / inside).symlink_to(run / "notes.txt")
    with pytest.raises(UserError, match=f"holds {inside}, a link to .*notes.txt \\(in it\\)"):
        Claim.take(run)
    assert (run / "notes.txt").read_text() == "my notes\n"
    (run / "notes.txt").unlink()
    # A named pipe where a record goes: writing it would block the run.
    (run / inside).unlink()
    os.mkfifo(run / inside)
    with pytest.raises(UserError, match=f"holds {inside}, which is neither a file nor a folder"):
        Claim.take(run)
    # Lightning's own links stay inside (save_last: link): they are fine.
    (run / inside).unlink()
    (run / "checkpoints").mkdir(exist_ok=True)
    (run / "checkpoints" / "epoch000.ckpt").write_bytes(b"x")
    (run / "checkpoints" / "last-link.ckpt").symlink_to("epoch000.ckpt")
    assert Claim.take(run).made_folder
    # wandb links its core's log into the user's cache from an attempt's own folder: never written through.
    logs = run / "wandb" / "offline-run-20261204_211814-abc" / "logs"
    logs.mkdir(parents=True)
    (logs / "debug-core.log").symlink_to(outside)
    (run / "wandb" / "latest-run").symlink_to("offline-run-20261204_211814-abc")  # wandb's own, inside wandb/
    assert Claim.take(run).made_folder
    (run / "wandb" / "debug-core.log").symlink_to(outside)  # anywhere else it is refused as any link is
    with pytest.raises(UserError, match="holds wandb/debug-core.log, a link to"):
        Claim.take(run)


@pytest.mark.slow
def test_resume_of_a_folder_of_the_users_names_the_key_given(tiny_data, tmp_path):
    mine = users_folder(tmp_path)
    before = snapshot(mine)
    import os
    import sys

    from conftest import run_python

    # No hydra.run.dir: resume=DIR alone runs in DIR.
    command = [sys.executable, str(ROOT / "train.py"), *TINY, f"resume={mine}"]
    line = one_line(run_python(command, {**os.environ, "DATA_DIR": str(tiny_data)}))
    assert line.startswith(f"error: resume={mine} already holds files this project did not write"), line
    assert snapshot(mine) == before


def refused_as_a_sweep_dir(folder: Path, given: str, args: list[str], tiny_data: Path) -> None:
    """`-m ARGS hydra.sweep.dir=GIVEN` naming a folder of the user's, run and with `plan=true`: one line naming the
    folder, and every file of it as it was."""
    before = snapshot(folder)
    for extra in ([], ["plan=true"]):
        line = one_line(run_cli(["-m", *args, *extra, f"hydra.sweep.dir={given}"], folder, tiny_data))
        assert f"hydra.sweep.dir={folder} already holds files this project did not write" in line, line
        assert snapshot(folder) == before


@pytest.mark.slow
def test_a_sweep_dir_of_the_users_is_refused_before_hydra_writes_in_it(tiny_data, tmp_path):
    """`-m hydra.sweep.dir=<a folder of the user's>`: Hydra's multirun.yaml and the launchers' jobs.json would be
    written over the user's files of those names; refused in one line, nothing written, for `plan=true` too."""
    mine = users_folder(tmp_path)
    (mine / "multirun.yaml").write_text("mine: true\n")
    (mine / "jobs.json").write_text("[1, 2]\n")
    refused_as_a_sweep_dir(mine, str(mine), [*TINY, "trainer.max_steps=2", "seed=1,2"], tiny_data)
    # A sweep dir of the project's is continued: the same sweep again finds its finished jobs.
    sweep = tmp_path / "sweep"
    args = ["-m", *TINY, "trainer.max_steps=2", "seed=1,2", f"hydra.sweep.dir={sweep}"]
    assert run_cli(args, sweep, tiny_data).returncode == 0
    again = run_cli(args, sweep, tiny_data)
    assert again.returncode == 0 and (again.stdout + again.stderr).count("already finished") == 2


def test_a_refused_run_in_hydras_own_dated_folder_leaves_no_empty_outputs_folder(tiny_data, tmp_path):
    """Without hydra.run.dir, Hydra makes outputs/<date>/<time>: a refused run takes all three away, and an
    `outputs/` that was there before stays."""
    # The default run dir (no hydra.run.dir on the command line), and the same template given.
    default = [sys.executable, str(ROOT / "train.py"), *REFUSED_LATE]
    env = {**os.environ, "DATA_DIR": str(tiny_data)}
    assert "val/no_such" in one_line(run_python(default, env, cwd=tmp_path))
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "outputs").mkdir()
    named = [*default, "hydra.run.dir=outputs/${now:%Y-%m-%d}/${now:%H-%M-%S-%f}"]
    assert "val/no_such" in one_line(run_python(named, env, cwd=tmp_path))
    assert [p.name for p in tmp_path.iterdir()] == ["outputs"] and list((tmp_path / "outputs").iterdir()) == []


def test_a_folder_holding_only_files_named_as_a_sweep_s_is_the_users(tmp_path):
    """A folder with the user's own multirun.yaml (or jobs.json) and nothing else was taken for a sweep dir of an
    earlier version, and Hydra rewrote the file; beside this project's job dirs those names are a sweep's."""
    from hydralight.rundir.ownership import check_sweep_usable

    for name in ("multirun.yaml", "jobs.json", "report.md", "curves.png"):
        mine = tmp_path / name.replace(".", "_")
        mine.mkdir()
        (mine / name).write_text("mine\n")
        with pytest.raises(UserError, match=f"already holds files this project did not write \\({name}\\)"):
            check_sweep_usable(mine)
    earlier = tmp_path / "earlier"
    (earlier / "0").mkdir(parents=True)
    manifest = {"status": "finished", "run_dir": str(earlier / "0"), "started_at": "2026-01-01T00:00:00"}
    (earlier / "0" / "manifest.json").write_text(json.dumps(manifest))
    (earlier / "multirun.yaml").write_text("hydra: {}\n")
    check_sweep_usable(earlier)  # an earlier version's sweep: its job dir and its record


@pytest.mark.slow
def test_a_folder_of_the_users_found_only_as_hydra_works_out_the_dir_is_refused_and_left_as_it_was(tiny_data, tmp_path):
    """`hydra.run.dir=exp_${seed}` and a sweep's job dirs are known once Hydra's job starts, after it wrote its log
    and record there: a folder of another Hydra app (its `.hydra/`, a log of its own) was taken for one of this
    attempt's and, refused, deleted whole. What the folder held before Hydra wrote is what counts."""
    mine = tmp_path / "exp_7"
    (mine / ".hydra").mkdir(parents=True)
    (mine / ".hydra" / "config.yaml").write_text("other: app\n")
    (mine / "myapp.log").write_text("my log\n")
    before = snapshot(mine)
    for extra in ([], ["data.data_dir=/nonexistent"]):  # refused at the claim, or later (missing data)
        line = one_line(run_cli([*TINY, "seed=7", *extra, f"hydra.run.dir={tmp_path}/exp_${{seed}}"], tmp_path,
                                tiny_data))  # fmt: skip
        assert "already holds files this project did not write" in line, line
        assert snapshot(mine) == before
    # A job dir of the user's in a sweep dir of the project's (sw_7/1): refused and left as it was; the other runs.
    sweep = tmp_path / "sw_7"
    args = ["-m", *TINY, "seed=7", f"hydra.sweep.dir={tmp_path}/sw_${{seed}}"]
    assert run_cli([*args, "trainer.max_steps=2"], sweep, tiny_data).returncode == 0
    shutil.copytree(mine, sweep / "1")
    done = run_cli([*args, "trainer.max_steps=2,3"], sweep, tiny_data)
    assert done.returncode == 1 and "1 of 2 jobs done" in done.stdout, done.stdout[-2000:]
    assert f"job dir={sweep / '1'} already holds files this project did not write" in done.stderr
    assert snapshot(sweep / "1") == before and (sweep / "0" / "results.json").is_file()
    # A sweep dir of the user's found so (another Hydra app's sweep: its multirun.yaml, notes): refused whole.
    theirs = tmp_path / "theirs_7"
    theirs.mkdir()
    (theirs / "multirun.yaml").write_text("hydra: {}\n")
    (theirs / "notes.txt").write_text("mine\n")
    refused_as_a_sweep_dir(
        theirs, f"{tmp_path}/theirs_${{seed}}", [*TINY, "seed=7", "trainer.max_steps=2,3"], tiny_data
    )


@pytest.mark.slow
def test_a_link_in_hydras_record_of_a_run_is_never_written_through(tiny_data, tmp_path):
    """A finished run whose `.hydra/config.yaml` someone replaced with a link to a file of theirs: continued with
    a run dir Hydra works out (`${...}`), Hydra's record was written through the link before the refusal said
    nothing was written."""
    run = tmp_path / "run_7"
    assert run_cli([*TINY, "trainer.max_steps=2", "seed=7"], run, tiny_data).returncode == 0
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    (run / ".hydra" / "config.yaml").unlink()
    (run / ".hydra" / "config.yaml").symlink_to(notes)
    before = snapshot(run)
    line = one_line(run_cli([*TINY, "trainer.max_steps=4", "seed=7", f"hydra.run.dir={tmp_path}/run_${{seed}}"],
                            tmp_path, tiny_data))  # fmt: skip
    assert "holds .hydra/config.yaml, a link to" in line, line
    assert notes.read_text() == "my notes\n" and snapshot(run) == before


@pytest.mark.slow
def test_ctrl_c_as_a_run_starts_leaves_no_run_dir_and_an_empty_folder_empty(tiny_data, tmp_path):
    """Ctrl-C before training takes the signal (the run building) ended the run with 130 and left the run dir it had
    begun (Hydra's record, the marker, the log), in a new folder and in an empty one of the user's."""
    from conftest import HELPERS

    stop = ["+callbacks.zz_signal._target_=signal_at.SignalAt", "+callbacks.zz_signal.step=0",
            "+callbacks.zz_signal.signum=SIGINT", "+callbacks.zz_signal.during=setup"]  # fmt: skip
    empty = tmp_path / "empty"
    empty.mkdir()
    for run in (tmp_path / "new" / "run", empty):
        done = run_cli([*TINY, *stop], run, tiny_data, PYTHONPATH=str(HELPERS))
        assert done.returncode == 130 and "interrupted" in done.stderr, (done.stdout[-2000:], done.stderr[-2000:])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"] and list(empty.iterdir()) == []
