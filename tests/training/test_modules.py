"""Every module is built through one call, the built-in classifier as a user's: what it gets from the plan and
the data follows from its constructor and what its class declares (hydralight.config.declaration)."""

import dataclasses
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import HELPERS, plan_of

from hydralight.errors import UserError
from hydralight.training.console import model_name
from hydralight.training.modules import build_module

SRC = Path(__file__).resolve().parents[2] / "src" / "hydralight"
CORE = ["config", "training", "resume", "launch", "rundir", "reports"]
MNIST_SIZES = {"num_classes": 10, "input_shape": (1, 28, 28)}


@pytest.fixture
def user_package(monkeypatch):
    monkeypatch.syspath_prepend(str(HELPERS / "user_project"))
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    yield
    for name in [m for m in sys.modules if m.startswith("my_tasks") or m == "test_modules"]:
        sys.modules.pop(name, None)


def test_the_classifier_and_a_users_module_are_built_by_the_same_call(user_package):
    classifier_plan = plan_of("model=cnn", "optim.lr=0.02")
    # lightning-hydra-template's way: a module taking a built network and a partial optimizer.
    spec = yaml.safe_load((HELPERS / "user_project" / "conf" / "model" / "template.yaml").read_text())
    users_plan = dataclasses.replace(plan_of().model, spec=spec)
    classifier = build_module(classifier_plan.model, MNIST_SIZES)
    users = build_module(users_plan, MNIST_SIZES)
    # The classifier sized its network by the data and took the plan's learning rate, as it declares.
    assert classifier.hparams["lr"] == 0.02 and classifier.net[-1].out_features == 10
    assert type(users).__name__ == "TemplateModule" and isinstance(users.net, torch.nn.Sequential)
    assert model_name(classifier) == "Classifier(SeedCNN)" and model_name(users) == "TemplateModule(Sequential)"


class DeclaresItsLr:
    """Stands for a user's module: a constructor with a learning-rate default, and the declarations."""

    lr_from_plan = True

    def __init__(self, lr: float = 0.5, width: int = 4) -> None:
        self.lr, self.width = lr, width

    @classmethod
    def check_config(cls, config):
        if config.get("width", 4) <= 0:
            raise ValueError(f"model.width={config['width']} must be positive: give it a width of 1 or more")


class KeepsItsLr:
    def __init__(self, lr: float = 0.5) -> None:
        self.lr = lr


def test_a_modules_declarations_decide_its_learning_rate_and_check_its_config(user_package):
    # A model config of no option (a user's own, untyped): the module's own keys.
    own = ["~model", "+model._target_=test_modules.KeepsItsLr"]
    declared = plan_of(*own, "model._target_=test_modules.DeclaresItsLr", "+model.width=3")
    assert declared.model.offered["lr"] == pytest.approx(1e-3)  # the plan's, though its default is 0.5
    keeps = plan_of(*own)
    assert "lr" not in keeps.model.offered  # its own default stands: the run chose none
    with pytest.raises(UserError, match=re.escape("model.width=0 must be positive")):
        plan_of(*own, "model._target_=test_modules.DeclaresItsLr", "+model.width=0")
    with pytest.raises(UserError, match=re.escape("model.lr is set by the plan; set optim.lr instead")):
        plan_of(*own, "model._target_=test_modules.DeclaresItsLr", "+model.lr=0.1")


class BuildsItsOwnNet:
    """Stands for a user's module with defaults of its own for arguments the classifier's option sets."""

    def __init__(self, net: torch.nn.Module | None = None, label_smoothing: float = 0.05) -> None:
        self.net, self.label_smoothing = net, label_smoothing


class NeedsANet:
    def __init__(self, net: torch.nn.Module, label_smoothing: float = 0.05) -> None:
        self.net, self.label_smoothing = net, label_smoothing


def test_a_module_named_over_an_option_keeps_its_own_defaults_and_says_which(user_package, capsys):
    """`model._target_=my.Module` over model=cnn: the option's network and label smoothing reached a module with
    defaults of its own for them, silently (it was given a SeedCNN where it builds its own network)."""
    own = plan_of("model._target_=test_modules.BuildsItsOwnNet").model.spec
    assert own == {"_target_": "test_modules.BuildsItsOwnNet"}
    (note,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: model._target_=")]
    assert "keeps its own defaults for net, label_smoothing" in note and "(model=cnn)" in note
    # An argument it cannot be built without takes the option's value; the command line's stay.
    needs = plan_of("model._target_=test_modules.NeedsANet", "model.label_smoothing=0.1").model.spec
    assert needs["net"]["_target_"].endswith("SeedCNN") and needs["label_smoothing"] == 0.1
    assert "note: model._target_=" not in capsys.readouterr().err


def test_the_core_names_no_task():
    # The built-in task's names and its data's sizes live in hydralight.tasks and hydralight.data alone.
    named = re.compile(r"classifier|mnist|\bnet\b|label_smoothing|28, ?28|num_classes.{0,4}10", re.IGNORECASE)
    found = [
        f"{path.relative_to(SRC)}:{n}: {line.strip()}"
        for package in CORE
        for path in sorted((SRC / package).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if named.search(line)
    ]
    assert found == []
