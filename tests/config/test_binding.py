"""What a `_target_` gets from its config and the plan, checked against its constructor before it is built."""

import pytest

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
        def __init__(self, width=3) -> None:  # no annotation: nothing to check against
            self.width = width

    assert bind(Loose, {"width": "abc"}, {}, "model") == {}
