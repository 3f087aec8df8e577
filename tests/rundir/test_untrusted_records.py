"""A run dir's records are untrusted data: read through one bounded loader, and a resumed run writes only into
its own run dir, locked, whatever its config.yaml or the command line says."""

import hashlib
import time

import pytest
import yaml
from conftest import TINY, one_line, run_cli

from hydralight.errors import UserError
from hydralight.rundir.record import RECORD_MAX_BYTES, read_json, read_yaml_record

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)

# Under the count of aliases (7 x 9 = 63), 9 ** 7 values once expanded: the reader hung on it.
SMALL_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(7)
)


@pytest.mark.parametrize(
    "content,says",
    [
        (BOMB, "more than 64 aliases"),
        (SMALL_BOMB, "aliases expand to more than 200000 values"),
        ("- a\n- b\n", "holds a list, not the mapping"),
        ("42\n", "holds a int, not the mapping"),
        ("a: [unclosed\n", "cannot be read as a run's record"),
        (b"\x00\xff\xfe binary", "cannot be read as a run's record"),
    ],
)
def test_a_record_that_is_no_mapping_of_ours_is_one_line_at_once(tmp_path, content, says):
    path = tmp_path / "config.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    start = time.perf_counter()
    with pytest.raises(UserError, match=says):
        read_yaml_record(path, "resume=x")
    assert time.perf_counter() - start < 5  # the bomb is refused while it is read, not after it grew


def test_links_devices_and_huge_files_are_not_read(tmp_path):
    outside = tmp_path / "outside.yaml"
    outside.write_text("a: 1\n")
    link = tmp_path / "config.yaml"
    link.symlink_to(outside)
    with pytest.raises(UserError, match="cannot be read"):
        read_yaml_record(link, "resume=x")
    big = tmp_path / "results.json"
    with big.open("wb") as f:
        f.truncate(RECORD_MAX_BYTES + 1)
    assert read_json(big) is None and read_json(link) is None
    with pytest.raises(UserError, match="cannot be read"):
        read_yaml_record(tmp_path / "..", "resume=x")
    with pytest.raises(UserError, match="none.yaml is missing"):
        read_yaml_record(tmp_path / "none.yaml", "resume=x")
    (tmp_path / "overrides.yaml").write_text("- a=1\n")
    assert read_yaml_record(outside, "x") == {"a": 1} and read_yaml_record(tmp_path / "overrides.yaml", "x", list)


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_a_resumed_config_that_writes_outside_its_run_dir_is_refused(tiny_data, tmp_path):
    other, run = tmp_path / "other", tmp_path / "run"
    for folder in (other, run):
        done = run_cli([*TINY, "trainer.max_steps=2"], folder, tiny_data)
        assert done.returncode == 0, done.stderr[-2000:]
    before = {p: digest(p) for p in (other / "checkpoints").iterdir()}
    saved = yaml.safe_load((run / "config.yaml").read_text())
    (tmp_path / "victim.ckpt").write_text("precious")
    outside = [("dirpath", str(other / "checkpoints")), ("save_dir", str(tmp_path / "elsewhere")),
               ("filename", "../../victim"), ("filename", str(tmp_path / "victim"))]  # fmt: skip
    for key, value in outside:
        edited = {
            **saved,
            "callbacks": {
                **saved["callbacks"],
                "model_checkpoint": {**saved["callbacks"]["model_checkpoint"], key: value},
            },
        }
        (run / "config.yaml").write_text(yaml.safe_dump(edited))
        line = one_line(run_cli(["resume=" + str(run), "trainer.max_steps=4"], run, tiny_data))
        assert f"would write outside its run dir: callbacks.model_checkpoint.{key}={value}" in line
    assert {p: digest(p) for p in (other / "checkpoints").iterdir()} == before
    assert not (tmp_path / "elsewhere").exists() and (tmp_path / "victim.ckpt").read_text() == "precious"
    for content in ("- a list\n", BOMB):
        (run / "config.yaml").write_text(content)
        assert "config.yaml" in one_line(run_cli(["resume=" + str(run), "trainer.max_steps=4"], run, tiny_data))


@pytest.mark.slow
def test_resume_elsewhere_takes_the_lock_of_the_dir_it_writes(tiny_data, tmp_path):
    from hydralight.rundir.lock import RunDirLock

    live = tmp_path / "live"
    done = run_cli([*TINY, "trainer.max_steps=2"], live, tiny_data)
    assert done.returncode == 0, done.stderr[-2000:]
    before = digest(live / "csv" / "metrics.csv")
    with RunDirLock(live):  # a run that trains there now
        line = one_line(run_cli([f"resume={live}", "trainer.max_steps=4", f"hydra.run.dir={tmp_path / 'other'}"],
                                tmp_path / "other", tiny_data))  # fmt: skip
    assert f"run dir {live} is in use by pid" in line
    assert digest(live / "csv" / "metrics.csv") == before
