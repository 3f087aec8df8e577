"""What a `_target_` gets from its config and the plan, checked against its constructor before it is built."""

import pytest
import torch

from hydralight.config.binding import bind
from hydralight.errors import UserError


class Net:
    def __init__(self, hidden: int = 8, lr: float | None = 1e-3, name: str = "net", bias: bool = True) -> None:
        self.hidden, self.lr, self.name, self.bias = hidden, lr, name, bias


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"hidden": "abc"}, "model.hidden=abc is not an integer, which Net takes (hidden: int); give an integer"),
        ({"lr": "fast"}, "model.lr=fast is not a number, which Net takes (lr: float); give a number"),
        ({"bias": "maybe"}, "model.bias=maybe is not true or false, which Net takes (bias: bool)"),
    ],
)
def test_a_string_where_the_constructor_asks_for_a_number_or_a_flag_is_one_line(spec, said):
    with pytest.raises(UserError) as err:
        bind(Net, spec, {}, "model")
    assert str(err.value).startswith(said)


def test_values_that_read_as_the_annotated_type_and_unannotated_ones_pass():
    assert bind(Net, {"hidden": 16, "lr": "1e-3", "name": "abc", "bias": "true"}, {}, "model") == {}

    class Loose:
        def __init__(self, width=3, name=None, act="relu", scale=1) -> None:  # no annotation: the default tells
            self.width, self.name, self.act, self.scale = width, name, act, scale

    assert bind(Loose, {"width": "7", "name": "abc", "act": 3, "scale": 0.5}, {}, "model") == {}
    with pytest.raises(UserError) as err:
        bind(Loose, {"width": "abc"}, {}, "model")
    assert str(err.value).startswith("model.width=abc is not a number, which ")
    assert str(err.value).endswith("Loose takes (width: unannotated, default 3); give a number")


class Needs:
    def __init__(self, hidden: int, vocab_size: int, lr: float = 0.1) -> None:
        self.hidden, self.vocab_size, self.lr = hidden, vocab_size, lr


def test_an_argument_without_a_default_that_nothing_gives_is_one_line():
    with pytest.raises(UserError) as err:
        bind(Needs, {}, {"vocab_size": 65}, "model")
    assert str(err.value).startswith("Needs needs hidden, which model does not give and the run does not offer")
    assert "add +model.hidden=<value>" in str(err.value)


def test_what_the_config_the_plan_or_the_data_later_gives_is_not_missing():
    assert bind(Needs, {"hidden": 4}, {"vocab_size": 65, "batch_size": 8}, "model") == {"vocab_size": 65}
    assert bind(Needs, {"hidden": 4}, {}, "model", pending=("vocab_size",)) == {}  # the data states it later
    assert bind(Needs, {"_args_": [4, 65]}, {}, "model") == {}  # given by position


def test_a_partial_target_is_called_with_more_than_its_config():
    # An optimizer `_partial_: true` gets its parameters from the module that calls it.
    assert bind(torch.optim.SGD, {"lr": 0.1, "_partial_": True}, {}, "optim", pending=None) == {}


class Template:
    """As lightning-hydra-template annotates its module and data module."""

    def __init__(self, net: torch.nn.Module, optimizer: torch.optim.Optimizer, width: int = 8,
                 split: tuple[int, int, int] = (55_000, 5_000, 10_000), lr: float | None = None) -> None:  # fmt: skip
        self.net, self.optimizer, self.width, self.split, self.lr = net, optimizer, width, split, lr


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"width": 1.5}, "model.width=1.5 is not an integer, which Template takes (width: int)"),
        ({"width": 2.0}, "model.width=2.0 is not an integer"),
        ({"width": True}, "model.width=True is not an integer"),
        ({"lr": True}, "model.lr=True is not a number"),
        ({"split": "abc"}, "model.split=abc is not a list, which Template takes (split: tuple[int, int, int])"),
        ({"split": 3}, "model.split=3 is not a list"),
        ({"net": "mlp"}, "model.net=mlp is not a torch nn.Module (a config with a _target_)"),
        ({"optimizer": "adam"}, "model.optimizer=adam is not a torch optimizer (a config with a _target_)"),
    ],
)
def test_a_value_that_cannot_be_what_the_annotation_asks_is_one_line(spec, said):
    with pytest.raises(UserError) as err:
        bind(Template, spec, {}, "model", pending=None)
    assert str(err.value).startswith(said)


def test_values_that_can_be_what_the_annotation_asks_pass():
    spec = {"width": 3, "split": [1, 2, 3], "lr": 1, "net": {"_target_": "torch.nn.Linear"}}
    assert bind(Template, spec, {}, "model", pending=None) == {}
    # An optimizer's rate is `float | Tensor`: a word is refused, a number read from a string passes.
    with pytest.raises(UserError, match="optim.lr=abc is not a number, which SGD takes"):
        bind(torch.optim.SGD, {"lr": "abc"}, {}, "optim", pending=None)
    assert bind(torch.optim.SGD, {"lr": "0.1"}, {}, "optim", pending=None) == {}


def test_a_plan_value_its_config_holds_one_level_down_names_where():
    class OwnOptimizer:
        def __init__(self, optimizer: torch.optim.Optimizer) -> None:
            self.optimizer = optimizer

    spec = {"optimizer": {"_target_": "torch.optim.Adam", "_partial_": True, "lr": 0.001}}
    with pytest.raises(UserError) as err:
        bind(OwnOptimizer, spec, {"lr": 0.01}, "model", explicit={"lr": "optim.lr=0.01"}, pending=None)
    assert str(err.value).endswith("set model.optimizer.lr instead")


class Lists:
    def __init__(self, width: int = 8, rate: float = 0.1, sizes: list[int] = (1,), split: tuple[int, int, int] = (1, 2, 3),
                 free=None, maybe: int | None = 3, sloppy: int = None) -> None:  # noqa: RUF013  # fmt: skip
        self.width = width


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"width": None}, "model.width=null is no value for Lists's width: int; give an integer"),
        ({"rate": [1, 2]}, "model.rate=[1, 2] is not a number"),
        ({"width": [1]}, "model.width=[1] is not an integer"),
        ({"sizes": ["a", "b"]}, "model.sizes=['a', 'b'] is not a list whose values are each an integer (a is not)"),
        ({"split": [5, 5, "abc"]}, "model.split=[5, 5, 'abc'] is not a list whose values are each an integer (abc is"),
        ({"split": [5, 5]}, "model.split=[5, 5] is not a list of 3 values"),
    ],
)
def test_nulls_lists_and_their_values_are_checked_against_the_annotation(spec, said):
    with pytest.raises(UserError) as err:
        bind(Lists, spec, {}, "model", pending=None)
    assert str(err.value).startswith(said), str(err.value)


def test_null_passes_where_the_annotation_or_the_default_allows_it():
    spec = {"free": None, "maybe": None, "sloppy": None, "sizes": [1, "2"], "split": [1, 2, 3]}
    assert bind(Lists, spec, {}, "model", pending=None) == {}


def test_null_for_a_string_is_refused_and_for_an_object_left_to_the_module():
    class Data:
        def __init__(self, data_dir: str = "data/", scheduler: torch.optim.lr_scheduler.LRScheduler = ...) -> None:
            self.data_dir, self.scheduler = data_dir, scheduler

    with pytest.raises(UserError, match="data.data_dir=null is no value for .*data_dir: str; give a string"):
        bind(Data, {"data_dir": None}, {}, "data", pending=None)
    assert bind(Data, {"scheduler": None}, {}, "data", pending=None) == {}  # `if scheduler is not None:` in its code


class Keeps:
    def __init__(self, sizes=None, head=None) -> None:
        self.sizes, self.head = sizes, head


def test_a_spec_s_own_convert_is_hydra_s_and_plain_containers_are_the_default():
    """A module written for plain Hydra (`_convert_: none`, reading `head.dropout`) got plain dicts: its own
    `_convert_` was overridden."""
    from omegaconf import DictConfig, ListConfig

    from hydralight.config.binding import instantiate

    spec = {"_target_": f"{__name__}.Keeps", "sizes": [1, 2], "head": {"dropout": 0.2}}
    plain = instantiate(spec)
    assert type(plain.sizes) is list and type(plain.head) is dict
    kept = instantiate({**spec, "_convert_": "none"})
    assert isinstance(kept.sizes, ListConfig) and isinstance(kept.head, DictConfig) and kept.head.dropout == 0.2
    assert type(instantiate({**spec, "_convert_": "partial"}).head) is dict


def test_a_name_its_module_lacks_is_said_as_such():
    """Python's own guess for `pkg.mod.Name` when mod has no Name: "'pkg.mod' is not a package"."""
    from hydralight.config.binding import import_target

    with pytest.raises(UserError, match=r"^callbacks.x._target_=hydralight.errors.Nope cannot be imported: "
                                        r"hydralight.errors has no Nope; check the name$"):  # fmt: skip
        import_target("hydralight.errors.Nope", "callbacks.x._target_")
    with pytest.raises(UserError, match=r"cannot be imported \(ModuleNotFoundError: No module named 'no_such_pkg'\)"):
        import_target("no_such_pkg.mod.Name", "model._target_")
    assert import_target("hydralight.errors.UserError", "x") is UserError
