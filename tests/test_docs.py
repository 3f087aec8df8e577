"""Every command README.md and docs/ show in a `bash` block runs as shown, page by page in the order shown, in
a folder prepared as a user's: MNIST (a stand-in of its files in DATA_DIR), a folder of images, a text file,
the examples project. A command that writes what a later one reads (a named run or sweep dir), one that reads
what an earlier one wrote (`mode=eval`, `mode=predict`, `resume=`, `init_from=`, a report) and one that only
prints or writes files (`--cfg`, `--help`, `hydra.launcher.dry_run=true`, the dstack generator) runs for real;
any other prints its plan (`plan=true`: the whole config and the resource plan checked, every job of a sweep,
nothing trained or submitted). `make` and `pip` lines are the install and services CI itself runs. Blocks of
another kind (```yaml, a plain ``` for a command of another host) are not commands."""

import os
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest
from conftest import ROOT, make_image_folder, make_mnist, run_python

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent
# What a command may name that would make it read or write a run's files: it runs for real.
REAL = re.compile(
    r"(^|\s)(hydra\.run\.dir=|hydra\.sweep\.dir=|mode=(eval|predict)|resume=(?!auto|never)|ckpt_path=|init_from="
    r"|--cfg|--help|hydra\.launcher\.dry_run=true|-m hydralight\.report|scripts/dstack_config\.py)"
)
NOT_RUN = ("make ", "pip ")


def commands(page: Path) -> list[tuple[int, str]]:
    """(line, command) of each command in the page's ```bash blocks: comments dropped, continuations joined."""
    found, block, joined, start = [], None, "", 0
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.strip().startswith("```"):
            block = None if block is not None else line.strip()[3:]
            continue
        if block != "bash" or not line.strip() or line.lstrip().startswith("#"):
            continue
        text = re.sub(r"\s+#\s.*$", "", line).rstrip()
        start = start if joined else number
        if text.endswith("\\"):
            joined += text[:-1] + " "
            continue
        found.append((start, (joined + text).strip()))
        joined = ""
    return found


def test_the_pages_show_commands():
    # A page's commands are found as this test reads them (a fence it misreads would hide them all).
    assert len([c for page in PAGES for c in commands(page)]) >= 60
    assert all(not c.startswith("#") and "\\" not in c for page in PAGES for _, c in commands(page))


def _workspace(root: Path) -> dict[str, str]:
    """A user's folder: the repository's entrypoint and scripts, the examples, data; and their environment."""
    for name in ("train.py", "scripts"):
        (root / name).symlink_to(ROOT / name)
    shutil.copytree(ROOT / "examples", root / "examples")
    make_image_folder(root / "my_images")
    make_image_folder(root / "new_photos", n_train=1, n_test=1)
    (root / "book.txt").write_text("the quick brown fox jumps over the lazy dog. " * 400)
    data = make_mnist(root / "datasets", n_train=7000, n_test=200)  # the default split keeps 2,000 to train on
    home = root / "home"
    home.mkdir()
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_", "HYDRA_", "SLURM_"))},
        "DATA_DIR": str(data),
        "HOME": str(home),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "WANDB_MODE": "offline",
        "MLFLOW_TRACKING_URI": "",
    }


def _argv(words: list[str], cwd: Path) -> list[str]:
    """A command's words as the shell runs them: `python` and the project's scripts from this environment."""
    words = [os.path.expandvars(w.replace("$PWD", str(cwd))) for w in words]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    if words[0] in ("torchrun", "hydralight-train"):
        return [str(BIN / words[0]), *words[1:]]
    return words


def _plan_only(command: str, part: str) -> bool:
    """Whether a command is run with `plan=true`: it writes nothing a later one reads, or it would train for
    long (a search's trials) or on another machine (SLURM jobs); the examples' small runs train for real."""
    if "plan=true" in part:
        return False
    if "hparams_search=" in part or ("hydra/launcher=slurm" in part and "dry_run" not in part):
        return True
    return not (REAL.search(part) or command.startswith("cd examples"))


def run_page_commands(page: Path, root: Path) -> None:
    env = _workspace(root)
    for line, command in commands(page):
        if command.startswith(NOT_RUN):
            continue
        cwd, here = root, dict(env)
        for part in command.split(" && "):
            words = shlex.split(part)
            while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
                name, value = words.pop(0).split("=", 1)
                here[name] = value
            if words[0] == "cd":
                cwd = (cwd / os.path.expanduser(words[1].replace("~", str(root / "home")))).resolve()
                continue
            if words[0] == "mkdir":
                (cwd / words[-1].replace("~", str(root / "home"))).mkdir(parents=True, exist_ok=True)
                continue
            argv = _argv(words, cwd)
            if _plan_only(command, part):
                argv.append("plan=true")
            result = run_python(argv, here, timeout=600, cwd=cwd)
            said = (result.stdout + result.stderr)[-3000:]
            assert result.returncode == 0, f"{page.relative_to(ROOT)}:{line}: {command}\n{said}"
            assert "Traceback" not in result.stderr, f"{page.relative_to(ROOT)}:{line}: {command}\n{said}"


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_command_of_the_page_runs_as_shown(page, tmp_path):
    run_page_commands(page, tmp_path)


def test_the_config_groups_table_lists_what_help_lists(tmp_path):
    result = run_python([sys.executable, str(ROOT / "train.py"), "--help"], cwd=tmp_path)
    listed = dict(re.findall(r"^(\w+): (.+)$", result.stdout.split("== Config ==")[0], flags=re.MULTILINE))
    shown = {
        m.group(1): set(re.findall(r"`([\w-]+)`", m.group(2)))
        for m in re.finditer(r"^\| `(\w+)` \| ([^|]+) \|", (ROOT / "README.md").read_text(), flags=re.MULTILINE)
    }
    helped = {group: set(options.split(", ")) for group, options in listed.items() if group not in ("schema", "local")}
    assert shown == helped


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_of_the_pages_leads_somewhere():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)]+)\)", page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            headings = (
                re.findall(r"^#+ (.+)$", file.read_text(), re.MULTILINE)
                if file.suffix == ".md" and file.is_file()
                else []
            )
            if not file.exists() or (anchor and anchor not in {_anchor(h) for h in headings}):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []
