"""A checkpoint or a run dir is data: the `_target_`s inside it are built only when the user's configs name them.

Each hostile file below is made of plain dicts and strings, so torch's `weights_only=True` loads it; the
targets it names would write a file of the attacker's choosing if they were ever called.
"""

from pathlib import Path

import pytest
import torch
import yaml
from conftest import TINY, one_line, run_cli

from hydralight.config.trust import check_trusted, configured_targets, targets
from hydralight.errors import UserError

CLASSIFIER = "hydralight.tasks.classifier.Classifier"
# mode=eval builds the module the checkpoint records: no model on the command line.
EVAL = [arg for arg in TINY if not arg.startswith("model=")]


def writers(victim: Path) -> dict[str, dict]:
    """Specs that create `victim` when Hydra instantiates them: direct, positional, partial, nested."""
    return {
        "open": {"_target_": "builtins.open", "file": str(victim), "mode": "w"},
        "args": {"_target_": "builtins.open", "_args_": [str(victim), "w"]},
        "partial": {"_target_": "pathlib.Path.touch", "_partial_": False, "_args_": [str(victim)]},
        "handler": {"_target_": "logging.FileHandler", "filename": str(victim)},
        "nested": {"_target_": "torch.nn.Sequential", "_args_": [{"_target_": "builtins.open", "file": str(victim)}]},
    }


def hostile_checkpoint(path: Path, where: str, spec: dict) -> Path:
    """A checkpoint of this project's layout whose record names `spec` at `where`."""
    net = {"_target_": "hydralight.tasks.nets.MLP"}
    model = {"_target_": CLASSIFIER, "_recursive_": False, "net": net}
    sizes: dict = {"num_classes": 10, "input_shape": [1, 28, 28]}
    hparams = {"net": net, "lr": 0.001, "optimizer": {"_target_": "torch.optim.Adam", "_partial_": True}}
    if where == "net":
        model["net"] = hparams["net"] = spec
    elif where == "module":
        model = {**spec}
    elif where == "optimizer":
        hparams["optimizer"] = spec
    elif where == "sizes":
        sizes["num_classes"] = spec
    record = {"module": model.get("_target_"), "model": model, "sizes": sizes, "global_size": 32}
    torch.save({"state_dict": {}, "hyper_parameters": hparams, "hydralight": record, "global_step": 1}, path)
    return path


@pytest.mark.parametrize("kind", sorted(writers(Path("x"))))
def test_a_target_no_config_names_is_refused_before_anything_is_imported(kind, tmp_path):
    victim = tmp_path / "planted"
    spec = {"model": {"_target_": CLASSIFIER, "net": writers(victim)[kind]}}
    with pytest.raises(UserError, match=r"which none of your configs names.*model\.net") as err:
        check_trusted(spec, configured_targets(), "ckpt_path=x.ckpt")
    assert "\n" not in str(err.value)
    assert not victim.exists()


def test_targets_the_configs_name_and_torch_modules_are_built():
    shipped = configured_targets()
    assert "torch.optim.Adam" in shipped and "hydralight.tasks.nets.MLP" in shipped
    # torch's and the project's modules, optimizers and schedules are classes that build tensors only.
    safe = {"a": {"_target_": "torch.nn.Linear"}, "b": {"_target_": "torch.optim.AdamW"}, "c": {"_target_": CLASSIFIER}}
    check_trusted(safe, set(), "x")
    check_trusted({"a": {"_target_": "my_project.Net"}}, configured_targets({"m": {"_target_": "my_project.Net"}}), "x")
    with pytest.raises(UserError, match="torch.load"):  # a torch function is not a class
        check_trusted({"a": {"_target_": "torch.load"}}, set(), "x")
    with pytest.raises(UserError, match=r"interpolation at a\.b"):
        check_trusted({"a": {"b": "${oc.env:HOME}"}}, set(), "x")
    assert [at for at, _ in targets({"x": [{"_target_": "a", "y": {"_target_": "b"}}]})] == ["x[0]", "x[0].y"]


def test_the_user_s_conf_folder_is_trusted(tmp_path, monkeypatch):
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "mine.yaml").write_text("_target_: my_project.tasks.Regressor\n")
    monkeypatch.chdir(tmp_path)
    assert "my_project.tasks.Regressor" in configured_targets()


def test_load_module_refuses_a_planted_target_and_builds_a_named_one(tmp_path):
    from hydralight.resume.policy import load_module

    victim = tmp_path / "planted"
    for kind, spec in writers(victim).items():
        for where in ("net", "module", "optimizer", "sizes"):
            path = hostile_checkpoint(tmp_path / f"{kind}-{where}.ckpt", where, spec)
            with pytest.raises(UserError, match="not built"):
                load_module(path)
            assert not victim.exists(), (kind, where)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["net", "module", "optimizer", "sizes"])
def test_mode_eval_of_a_planted_checkpoint_writes_nothing_and_says_one_line(where, tiny_data, tmp_path):
    victim = tmp_path / "planted"
    for kind, spec in writers(victim).items():
        ckpt = hostile_checkpoint(tmp_path / f"{kind}.ckpt", where, spec)
        line = one_line(run_cli(["mode=eval", f"ckpt_path={ckpt}", *EVAL], tmp_path / f"run-{kind}", tiny_data))
        assert "not built" in line and "none of your configs names" in line, line
        assert not victim.exists(), kind
        assert not (tmp_path / f"run-{kind}").exists()


@pytest.mark.slow
def test_init_from_and_resume_build_from_this_run_s_config(tiny_data, tmp_path):
    victim = tmp_path / "planted"
    ckpt = hostile_checkpoint(tmp_path / "h.ckpt", "net", writers(victim)["open"])
    # init_from builds the module this command names and only compares the checkpoint's.
    line = one_line(run_cli([*TINY, "model=mlp", f"init_from={ckpt}"], tmp_path / "tuned", tiny_data))
    assert "another model" in line and not victim.exists()
    # A run dir whose saved config was made to name a file writer: resume=RUN_DIR refuses it.
    run = tmp_path / "run"
    assert run_cli([*TINY, "trainer.max_steps=2"], run, tiny_data).returncode == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    saved["callbacks"]["evil"] = writers(victim)["handler"]
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    line = one_line(run_cli([f"resume={run}", "trainer.max_steps=4"], tmp_path / "elsewhere", tiny_data))
    assert "logging.FileHandler at callbacks.evil" in line and not victim.exists()


@pytest.mark.slow
def test_mode_eval_compares_a_checkpoint_s_sizes_before_building_its_module(tiny_data, tmp_path):
    # A record claiming 10**12 classes would allocate a layer of that size if it were built first.
    ckpt = hostile_checkpoint(tmp_path / "huge.ckpt", "sizes", 10**12)
    line = one_line(run_cli(["mode=eval", f"ckpt_path={ckpt}", *EVAL], tmp_path / "run", tiny_data))
    assert "was trained on data with" in line and "num_classes 1000000000000" in line, line
