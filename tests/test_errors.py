"""User errors: one line, with the fix."""

import pytest

from hydralight.errors import UserError, require


def test_a_missing_optional_package_names_the_extra_that_installs_it():
    with pytest.raises(
        UserError, match=r"^logger=tensorboard needs no_such_pkg_x, .*pip install 'hydralight\[tensorboard\]'$"
    ):
        require("no_such_pkg_x", "tensorboard", "logger=tensorboard")
    require("json", "search", "anything")  # installed: nothing to say


def test_a_refusal_is_one_write_so_ranks_refusing_at_once_keep_their_lines_apart(monkeypatch):
    """`print` writes the text and its newline apart: two ranks refusing together (torchrun) printed
    `...)error: ...` on one line."""
    import sys

    from hydralight.errors import exit_on_user_error

    writes: list[str] = []

    class Stream:
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stderr", Stream())

    @exit_on_user_error
    def refused() -> None:
        raise UserError("hardware=4gpu needs 4 GPUs; this machine has 0")

    with pytest.raises(SystemExit) as ended:
        refused()
    assert ended.value.code == 2 and writes == ["error: hardware=4gpu needs 4 GPUs; this machine has 0\n"]
