"""Where a run's options come from: the shipped ones (conf/ at the top of the repository, inside the package as
hydralight/conf, so an installed copy has them too) and the user's own, ./conf of the folder a run starts from."""

from __future__ import annotations

from pathlib import Path

# In a checkout, src/hydralight/conf links to the repository's conf/ (one copy); a wheel carries the files.
SHIPPED_CONF = Path(__file__).resolve().parents[1] / "conf"


def user_conf() -> Path | None:
    """`./conf` when it holds the user's own options; None when there is none, or when it is the shipped folder
    itself (a run started from the repository's top)."""
    user = Path("conf")
    if not user.is_dir() or user.resolve() == SHIPPED_CONF.resolve():
        return None
    return user
