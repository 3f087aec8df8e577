"""User errors: one line, with the fix."""

import pytest

from hydralight.errors import UserError, require


def test_a_missing_optional_package_names_the_extra_that_installs_it():
    with pytest.raises(
        UserError, match=r"^logger=tensorboard needs no_such_pkg_x, .*pip install 'hydralight\[tensorboard\]'$"
    ):
        require("no_such_pkg_x", "tensorboard", "logger=tensorboard")
    require("json", "search", "anything")  # installed: nothing to say
