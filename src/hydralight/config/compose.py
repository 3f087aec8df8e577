"""From the command line to composed configs: what the invocation asks for (one run, a sweep, a print), read
once, and the config of every job of it composed and type-checked before anything runs or is written."""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import re
import shlex
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from hydralight.config.folders import user_conf
from hydralight.config.hydra_internals import hydra_args, sweep_jobs
from hydralight.config.schema import override_key, planned_trainer_key, template_key, unknown_key
from hydralight.errors import UserError
from hydralight.rundir.launch import check_writable

# The config group of hyperparameter search presets; they only make sense with -m.
SEARCH_GROUP = "hparams_search"


@dataclass(frozen=True)
class Invocation:
    """The command line of `python train.py`, read once, by Hydra's own parser: its overrides and what it asks
    Hydra to do."""

    argv: tuple[str, ...]
    # The run dir the launch names when the command line names none: `resume=RUN_DIR`, the shared dir of a
    # torchrun or srun launch (rundir.launch.launch_run_dir, read off the composed config).
    launch_dir: str | None = None

    @functools.cached_property
    def args(self) -> argparse.Namespace:
        """Hydra's reading of the command line; overrides it would refuse as "unrecognized arguments" (after a
        flag and more overrides) are one line saying how to write them."""
        args, rest = hydra_args(list(self.argv))
        if rest:
            overrides = [*args.overrides, *rest]
            flags = [a for a in self.argv if a not in overrides]  # with their values (`--cfg job`)
            raise UserError(
                f"{' '.join(rest)} comes after {' '.join(flags)} and other overrides: Hydra reads the overrides as one "
                f"group; put the flags before or after them all: python train.py {shlex.join([*flags, *overrides])}"
            )
        return args

    @property
    def multirun(self) -> bool:
        return bool(self.args.multirun) or "hydra.mode=MULTIRUN" in self.override_args

    @property
    def print_only(self) -> bool:
        """Hydra prints something (the config, help) and runs nothing."""
        a = self.args
        return bool(a.cfg or a.help or a.hydra_help or a.info or a.shell_completion)

    @property
    def other_config(self) -> bool:
        """Another config tree, or nothing of the run's composed (Hydra's help, --info, shell completion): Hydra
        checks and prints it itself."""
        a = self.args
        return bool(a.config_path or a.config_name or a.config_dir or a.hydra_help or a.info or a.shell_completion)

    @property
    def override_args(self) -> list[str]:
        """Every override of the command line, Hydra's own keys included (what Hydra's override parser reads)."""
        return list(self.args.overrides)

    @property
    def overrides(self) -> list[str]:
        """The config overrides, without Hydra's flags and Hydra's own keys."""
        return [arg for arg in self.override_args if not arg.lstrip("+~").startswith("hydra")]

    def check_readable(self) -> None:
        """Refuse, in one line, an override Hydra's parser cannot read; the commonest is a value with a space
        (a path): unquoted in the shell it arrives split into words, and Hydra needs quotes inside the value."""
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parser = OverridesParser.create()
        args = self.override_args
        for arg in args:
            if any(ord(c) < 32 or ord(c) == 127 for c in arg):  # a newline would print a forged line of its own
                raise UserError(
                    f"{arg.encode('unicode_escape').decode()} holds a control character (a newline, a tab, an "
                    "escape); write the value without it"
                )
        for i, arg in enumerate(args):
            try:
                parser.parse_overrides([arg])
                continue
            except Exception as err:  # Hydra's OverrideParseException, whatever its message says
                reason = _parse_reason(err, arg)
            key, sep, value = arg.partition("=")
            if not sep and i > 0 and "=" in args[i - 1]:  # `key=my runs/a`: the shell split the value at its space
                words = [args[i - 1]]
                for word in args[i:]:
                    if "=" in word:
                        break
                    words.append(word)
                key, _, first = words[0].partition("=")
                value = " ".join([first, *words[1:]])
                raise UserError(
                    f"{key}={value} reached Hydra as {len(words)} words; a value with spaces needs quotes, "
                    f"in the value and around the override: {_quoted(key, value)}"
                )
            if sep and any(c.isspace() for c in value):
                raise UserError(
                    f"{arg} cannot be read ({reason}); a value with spaces needs quotes inside the override: "
                    f"{_quoted(key, value)}"
                )
            if not sep:
                raise UserError(f"{arg} is not an override ({reason}); write key=value")
            raise UserError(
                f"{arg} cannot be read ({reason}); to pass the value as written, quote it: {_quoted(key, value)}"
            )

    def value(self, key: str) -> str | None:
        """The value the command line gives `key` (the last one wins), without Hydra's quotes."""
        for arg in reversed(self.override_args):
            if arg.lstrip("+").startswith(f"{key}="):
                value = arg.split("=", 1)[1]
                if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                    value = value[1:-1]
                return value
        return None

    @property
    def plan_only(self) -> bool:
        return self.value("plan") in ("true", "True")

    def fixed_run_dir(self) -> str | None:
        """The run dir a single run (or `plan=true`) will write, when the command line or the launch names it (a
        rerun, a requeue, `resume=RUN_DIR`): checked and locked before Hydra writes its record there."""
        if self.multirun or self.print_only:
            return None
        named = self._named_run_dir
        return None if named is None or "${" in named else named  # `${now:...}`: Hydra names it; locked there

    @property
    def resumed(self) -> bool:
        """`resume=RUN_DIR`: the run continues in RUN_DIR, whatever `hydra.run.dir` says (`ignored_run_dir`)."""
        return self.launch_dir is not None and self.launch_dir == self.value("resume")

    @property
    def ignored_run_dir(self) -> str | None:
        """A `hydra.run.dir` given beside `resume=RUN_DIR` that names another folder: not used."""
        given = self.value("hydra.run.dir")
        if not self.resumed or given is None or Path(given).absolute() == Path(str(self.launch_dir)).absolute():
            return None
        return given

    @property
    def _named_run_dir(self) -> str | None:
        return self.launch_dir if self.resumed else self.value("hydra.run.dir") or self.launch_dir

    @property
    def run_dir_key(self) -> str:
        """The key that named the run dir, for messages: `resume=RUN_DIR` runs in RUN_DIR."""
        return "resume" if self.resumed else "hydra.run.dir"

    def fixed_sweep_dir(self, multirun: bool = False) -> str | None:
        """The sweep dir a `-m` run (or one whose config sets multirun: `multirun`) will write, when the command
        line names it: checked before Hydra writes its record there."""
        if not (self.multirun or multirun) or self.print_only:
            return None
        named = self.value("hydra.sweep.dir")
        return None if named is None or "${" in named else named

    def hydra_record_dir(self) -> str | None:
        """The folder of the run dir where Hydra writes its own record (`hydra.output_subdir`; None: none): by
        default none in a continued run's own dir (rundir.launch.record_subdir)."""
        given = self.value("hydra.output_subdir")
        if given is None:
            return None if self.resumed else ".hydra"
        return None if given in ("null", "") else given

    def check_writable(self) -> None:
        """Refuse a run or sweep dir that cannot be written, before Hydra starts."""
        if self.print_only:
            return
        check_writable(self._output_template(), "hydra.sweep.dir" if self.multirun else "hydra.run.dir")

    def _output_template(self) -> str:
        key = "hydra.sweep.dir" if self.multirun else "hydra.run.dir"
        # Without one: conf/hydra/default.yaml's, a dated folder inside `outputs/` (`multirun/`).
        named = self.value(key) if self.multirun else self._named_run_dir
        return named or f"{'multirun' if self.multirun else 'outputs'}/${{now:}}"

    def missing_output_folders(self) -> tuple[Path, ...]:
        """The folders above a run or sweep dir (`outputs/` of `outputs/${now:...}`) which do not exist yet, the
        deepest first: made for this run, and removed with it when it is refused and they are left empty."""
        template = self._output_template()
        parts = Path(template).parts
        fixed = parts[: next((i for i, part in enumerate(parts) if "${" in part), len(parts) - 1)]
        root = Path(*fixed).absolute() if fixed else Path.cwd()
        return tuple(p for p in (root, *root.parents) if not p.exists())


def _parse_reason(err: BaseException, arg: str) -> str:
    """The line of a Hydra override parse error that says what is wrong (its others name the grammar's docs)."""
    lines = [
        line for line in str(err).splitlines() if line.strip() and not line.startswith(("See https", "Error parsing"))
    ]
    lexer = "LexerNoViableAltException: "
    if len(lines) == 2 and lines[0].startswith(lexer) and lines[1].strip() == "^":  # a caret under the character
        at = len(lines[1]) - 1 - len(lexer)
        if 0 <= at < len(arg):
            return f"unexpected {arg[at]!r} at character {at + 1}"
    return lines[0] if lines else type(err).__name__


def _quoted(key: str, value: str) -> str:
    """`key='value'` as Hydra reads it back (`key="value"` when the value holds a '), written for the shell."""
    quote = '"' if "'" in value and '"' not in value else "'"
    override = f"{key}={quote}{value.replace(chr(92), chr(92) * 2).replace(quote, chr(92) + quote)}{quote}"
    if any(c in override for c in "$`!\\"):
        return shlex.quote(override)
    return '"' + override.replace('"', '\\"') + '"'


def shadowed_options(config_dir: str, user: Path | None = None, added: Sequence[Path] = ()) -> list[str]:
    """Options of `./conf` (and of the folders `--config-dir` and `hydra.searchpath` add) that a shipped option
    of the same group and name hides: Hydra takes the package's first, so such a file is never used (a user's
    `conf/data/<a shipped name>.yaml`; an added folder's `train.yaml`)."""
    user = user if user is not None else user_conf()
    lines, seen = [], {Path(config_dir).resolve()}  # the shipped folder itself hides nothing
    for folder in (*([user] if user is not None else []), *added):
        if not folder.is_dir() or folder.resolve() in seen:
            continue
        seen.add(folder.resolve())
        for path in sorted(folder.rglob("*.yaml")):
            if not (Path(config_dir) / path.relative_to(folder)).is_file():
                continue
            if path.parent != folder:
                option = f"{path.parent.relative_to(folder).as_posix()}={path.stem}"
                lines.append(
                    f"{path} is not used: the shipped option {option} comes first; give yours a name of its own"
                )
            elif folder != user:
                lines.append(
                    f"{path} is not used: the shipped primary config {path.name} comes first; name yours "
                    "otherwise and pick it with --config-name"
                )
    return lines


def _say_shadowed(config_dir: str, invocation: Invocation) -> None:
    for line in shadowed_options(config_dir, added=_added_config_folders(invocation)):
        print(f"note: {line}", file=sys.stderr, flush=True)


def _added_config_folders(invocation: Invocation) -> list[Path]:
    """The folders `--config-dir` and `hydra.searchpath=[file://...]` of the command line add to Hydra's search."""
    folders = [Path(invocation.args.config_dir)] if invocation.args.config_dir else []
    searchpath = invocation.value("hydra.searchpath") or ""
    folders += [Path(entry) for entry in re.findall(r"file://([^,\]\s'\"]+)", searchpath)]
    return folders


def reach_module_arguments(config_dir: str, config_name: str, invocation: Invocation) -> Invocation:
    """The command line with `model.X=v` (`data.X=v`) read as `++model.X=v` where X is an argument of your module's
    (data module's) constructor that its config does not list: Hydra refuses a key it has never seen, and the
    constructor takes it."""
    given = [a for a in invocation.overrides if re.match(r"(model|data)\.(?!_)\w+=", a)]
    if not given:
        return invocation
    from hydra import compose, initialize_config_dir

    from hydralight.config.binding import accepted_arguments, import_target

    # The modules the rest of the command line chooses (sweep values left out: they choose no module).
    rest = [a for a in invocation.overrides if a not in given and not re.search(r"[,(]", a.partition("=")[2])]
    try:
        with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=rest)
    except Exception:  # compose_jobs says what is wrong with the command line
        return invocation
    taken = set()
    for group in ("model", "data"):
        node = cfg.get(group) or {}
        missing = [a for a in given if a.startswith(f"{group}.") and a.split("=", 1)[0].split(".")[1] not in node]
        # A typed config (a shipped option's schema) lists every argument of the module it names.
        if not missing or "_target_" not in node or not _replaced_target(node):
            continue
        try:
            target = import_target(str(node["_target_"]), f"{group}._target_")
        except UserError:
            continue  # said where the module is built
        names, takes_any = accepted_arguments(target)
        for arg in missing:
            key = arg.split("=", 1)[0].split(".")[1]
            if key not in names and not takes_any:
                raise UserError(
                    f"{group}.{key} is not an argument of {getattr(target, '__qualname__', target)} (it takes "
                    f"{', '.join(sorted(names)) or 'none'}); fix its name"
                )
            taken.add(arg)
    return Invocation(tuple(f"++{a}" if a in taken else a for a in invocation.argv))


def _record_as_typed(cfg: DictConfig, reached: Invocation, typed: Invocation) -> None:
    """Hydra's record of the command line (`overrides.yaml`, the job's name) holds `model.X=v` as it was typed, not
    the `++model.X=v` it was composed with."""
    added = {f"++{arg}": arg for arg in typed.argv if f"++{arg}" in reached.argv}
    with open_dict(cfg.hydra):
        cfg.hydra.overrides.task = [added.get(str(o), str(o)) for o in cfg.hydra.overrides.task]
        name = str(cfg.hydra.job.override_dirname)
        for composed, arg in added.items():
            name = name.replace(composed, arg)
        cfg.hydra.job.override_dirname = name


def _replaced_target(node: Any) -> bool:
    """Whether a config's `_target_` is another than its schema's (`model._target_=my.Module` over a shipped
    option): the schema then says nothing of its arguments. An untyped config has no schema to go by."""
    kind = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(kind):
        return True
    default = next((f.default for f in dataclasses.fields(kind) if f.name == "_target_"), None)
    return default is not None and node.get("_target_") != default


def compose_jobs(
    config_dir: str,
    config_name: str,
    invocation: Invocation,
    hydra_modes: set | None = None,
    for_hydra: list[DictConfig] | None = None,
    job_name: str | None = None,
) -> list[DictConfig]:
    """Compose the config of the run as Hydra will (of a `-m` sweep: the config the sweep starts from, its swept
    values left out; the sweeper checks each job's, `check_sweep`); a wrong type or choice is a UserError naming
    the key, the value and what is allowed. `hydra_modes` receives the `hydra.mode` the config sets (None: the
    command line decides). `for_hydra` receives the whole config (Hydra's node included), composed with the
    overrides Hydra runs it with, to be handed to Hydra (hydra_internals.run_composed) instead of composing it
    again; `job_name` is Hydra's name of the job (`hydra.job.name`)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    from hydralight.config.schema import explain

    if invocation.other_config:
        _say_shadowed(config_dir, invocation)
        return []
    if invocation.multirun and invocation.args.cfg:
        # Hydra refuses the pair with a traceback.
        raise UserError("--cfg prints the config of one run; drop -m (each job of a sweep composes the same way)")
    invocation.check_readable()
    _say_shadowed(config_dir, invocation)
    searched = [a for a in invocation.overrides if a.startswith(f"{SEARCH_GROUP}=") and a != f"{SEARCH_GROUP}=null"]
    _refuse_optuna_plugin_keys(override_key(a) for a in invocation.override_args)
    mode = RunMode.MULTIRUN if invocation.multirun else RunMode.RUN
    named = {"job_name": job_name} if job_name else {}  # else the compose API's own default

    def load(invocation: Invocation) -> tuple[Any, Exception | None, list[str]]:
        # Composed with Hydra's keys too, as Hydra will compose it.
        overrides = list(invocation.override_args if for_hydra is not None else invocation.overrides)
        with initialize_config_dir(config_dir=config_dir, version_base="1.3", **named):
            try:
                loader = GlobalHydra.instance().config_loader()
                return loader.load_configuration(config_name=config_name, overrides=overrides, run_mode=mode), None, []
            except Exception as err:
                return None, err, overrides

    if invocation.multirun:  # the sweeper composes each job with the overrides this config records
        invocation = reach_module_arguments(config_dir, config_name, invocation)
    cfg, err, overrides = load(invocation)
    if err is not None and not invocation.multirun:
        # `model.X=` an argument of a user's module its config does not list: composed again as `++model.X=`
        # (only then: every other run's command line is composed once).
        reached = reach_module_arguments(config_dir, config_name, invocation)
        if reached.argv != invocation.argv:
            cfg, err, overrides = load(reached)
            if err is None:
                _record_as_typed(cfg, reached, invocation)
    if err is not None:
        raise UserError(explain(err, overrides)) from None
    if hydra_modes is not None:
        hydra_modes.add(cfg.hydra.get("mode"))
    if for_hydra is not None:
        for_hydra.append(copy.deepcopy(cfg))  # before the check below takes Hydra's node off
    # A search preset may set multirun itself (`hydra: {mode: MULTIRUN}`, as the template's do).
    if (
        searched
        and not invocation.multirun
        and not invocation.print_only
        and getattr(cfg.hydra.get("mode"), "name", None) != "MULTIRUN"
    ):
        raise UserError(f"{searched[0]} runs many trials: add -m (python train.py -m {searched[0]} ...)")
    _refuse_optuna_plugin_keys(f"hydra.sweeper.{key}" for key in _keys_below(cfg.hydra.get("sweeper") or {}))
    with open_dict(cfg):
        del cfg["hydra"]  # what compose() returns without return_hydra_config
    check_composed(cfg)
    return [cfg]


# A sweep of up to this many jobs has every job's config checked before the first starts. A larger one has
# every value it sweeps checked instead (so that its first job starts in seconds whatever its size): one config
# is composed for each choice of a swept config group (`model=mlp,cnn`), and each value of a swept key is set
# on the first job's config (`seed=range(100)`: 100 assignments, not 100 compositions); each job's whole config
# is composed and checked as it starts.
CHECKED_UPFRONT = 100
# The sweepers that run every combination of the values given (Hydra's, and the one the project's runs use).
BASIC_SWEEPERS = ("hydra/sweeper=basic", "hydra/sweeper=hydralight_basic")


def jobs_to_check(jobs: Sequence[Sequence[str]], groups: frozenset[str] = frozenset()) -> list[tuple[int, list[str]]]:
    """The jobs (with their numbers) whose configs are composed before a sweep starts: all of a small sweep;
    of a larger one, each job that sets a choice of a config group in `groups` no job before it set (the first
    job always)."""
    if len(jobs) <= CHECKED_UPFRONT:
        return [(number, list(job)) for number, job in enumerate(jobs)]
    seen: set[str] = set()
    chosen: list[tuple[int, list[str]]] = []
    for number, job in enumerate(jobs):
        choices = {o for o in job if override_key(o) in groups}
        if not chosen or not seen.issuperset(choices):
            seen.update(choices)
            chosen.append((number, list(job)))
    return chosen


def check_sweep(
    overrides: list[str],
    groups: frozenset[str],
    parser: Any,
    compose_job: Callable[[list[str]], DictConfig],
    check_job: Callable[[DictConfig], None] = lambda cfg: None,
) -> list[list[str]]:
    """The jobs of a basic sweep over `overrides` (its command line's and its config's `hydra.sweeper.params`),
    checked before the first starts: each job's config composed (`compose_job`, the sweeper's composition, which
    the launcher then runs) and checked, of a large sweep those that give each swept value once (`jobs_to_check`;
    `groups`: the config groups of the sweep's config; `check_job`: what the run checks of a config before it
    plans its hardware). A wrong value is a UserError naming the job."""
    from hydralight.config.schema import explain

    jobs = _sweep_jobs(overrides, parser)
    checked = jobs_to_check(jobs, groups)
    if len(checked) < len(jobs):  # said at once, with what is checked when
        print(
            f"sweep of {len(jobs)} jobs: checking every value it sweeps first ({len(checked)} configs composed); "
            "each job's whole config is checked as it starts",
            file=sys.stderr,
            flush=True,
        )
    elif len(jobs) > 1:
        print(f"sweep of {len(jobs)} jobs: checking each job's config first", file=sys.stderr, flush=True)
    for number, job in checked:
        prefix = f"sweep job {number} ({' '.join(job)}): " if len(jobs) > 1 else ""
        try:
            cfg = compose_job(job)
            check_composed(cfg)
            check_job(cfg)
        except UserError as err:
            raise UserError(f"{prefix}{err}") from None
        except Exception as err:
            raise UserError(prefix + explain(err, job)) from None
        if number == 0 and len(checked) < len(jobs):
            _check_swept_values(cfg, overrides, groups, len(jobs), check_job)
    return jobs


class ComposedOnce:
    """A sweep's config loader that hands each job's config composed by the sweep's check (`keep`) to the
    launcher that runs the job, instead of composing it again; every other call goes to Hydra's loader."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader
        self._kept: dict[tuple[str, ...], list[DictConfig]] = {}

    def keep(self, job: Sequence[str], cfg: DictConfig) -> DictConfig:
        self._kept.setdefault(tuple(job), []).append(cfg)
        return cfg

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        kept = self._kept.get(tuple(sweep_overrides))
        return kept.pop(0) if kept else self._loader.load_sweep_config(master_config, sweep_overrides)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_loader", "_kept"):
            raise AttributeError(name)  # unpickling asks before the attributes are there
        return getattr(self._loader, name)


def _check_swept_values(
    base: DictConfig, overrides: list[str], groups: frozenset[str], jobs: int, check_job: Callable[[DictConfig], None]
) -> None:
    """Set each value of each swept key that is no config group on `base` (a job's composed config, its
    schema's types in force), as the override would, and check the config so made (`check_job`): a value of the
    wrong type, or one the run refuses, is one line."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    from hydralight.config.schema import explain

    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.key_or_group
        if not override.is_sweep_override() or not override.is_discrete_sweep() or key in groups:
            continue
        if override.type == OverrideType.DEL or key.startswith("hydra."):
            continue
        trial = copy.deepcopy(base)  # one copy a key: each value replaces the one before
        for value, text in zip(override.sweep_iterator(), override.sweep_string_iterator(), strict=True):
            try:
                with open_dict(trial) if override.type != OverrideType.CHANGE else contextlib.nullcontext():
                    OmegaConf.update(trial, key, value, merge=True)
                check_job(trial)
            except Exception as err:
                given = f"{'+' * (override.type != OverrideType.CHANGE)}{key}={text}"
                reason = str(err) if isinstance(err, UserError) else explain(err, [given])
                raise UserError(f"a job of the sweep of {jobs} ({given}): {reason}") from None


def _sweep_jobs(overrides: list[str], parser: Any) -> list[list[str]]:
    """The overrides of every job of a basic sweep, `glob(...)` over a group's options expanded as Hydra will (the
    shipped ones and ./conf's: `parser` is Hydra's override parser, with its config loader)."""
    from hydralight.config.schema import explain

    try:
        parsed = parser.parse_overrides(overrides)
    except Exception as err:
        raise UserError(f"cannot read the sweep: {explain(err, overrides)}") from None
    try:
        jobs = sweep_jobs(parsed)
    except Exception as err:  # a glob() over a key that is no config group, say
        raise UserError(f"cannot read the sweep: {_unexpandable(parsed) or explain(err, overrides)}") from None
    if not jobs:
        swept = " ".join(o.input_line for o in parsed if o.is_sweep_override() and o.input_line)
        raise UserError(f"the sweep has no jobs: {swept} matches no option; `python train.py --help` lists them")
    return jobs


def _keys_below(node: Any, prefix: str = "") -> Iterator[str]:
    """Every key of a mapping, nested keys dotted (`sampler.seed`); the searched keys (`params`) left out."""
    if isinstance(node, dict | DictConfig):
        for key in node:
            name = f"{prefix}{key!s}"
            yield name
            if str(key) != "params":
                yield from _keys_below(node[key], f"{name}.")


def _refuse_optuna_plugin_keys(keys: Iterable[str]) -> None:
    """A key of hydra-optuna-sweeper's config (a template's search preset, its habits on the command line) is
    refused in one line naming this project's, instead of Hydra's error naming the config class."""
    for key in keys:
        if (refusal := template_key(key)) is not None:
            raise UserError(refusal)


def _unexpandable(parsed: list[Any]) -> str | None:
    """Which sweep override Hydra cannot expand by itself, and why, when its own error names neither (a
    `range()` inside a list: `lr=range(5),abc` fails on an internal type)."""
    from hydra.core.override_parser.types import IntervalSweep

    for override in parsed:
        if isinstance(override.value(), IntervalSweep):  # a range of reals: a search draws from it, a grid cannot
            return (
                f"{override.input_line} is an interval, which only a search samples: add hparams_search=optuna "
                "(python train.py -m hparams_search=optuna ...), or give the values to try (0.001,0.003,0.01)"
            )
        try:
            sweep_jobs([override])
        except Exception:
            return (
                f"{override.input_line} cannot be expanded into values (a range() or glob() inside a list is not "
                "supported): write the values out, or sweep it as one range()"
            )
    return None


# Groups of every run's config (the project's `train` config gives them).
RUN_GROUPS = ("hardware", "strategy", "trainer", "batch", "model", "data")


def check_run_keys(cfg: DictConfig) -> None:
    """A primary config of the user's (`--config-name`) that does not build on the project's is refused in one
    line, before a run or sweep reads a key it lacks."""
    if not any(key in cfg for key in RUN_GROUPS):  # one of them gone is a `~key`, said as such below
        raise UserError(
            f"the primary config (--config-name) has none of {', '.join(RUN_GROUPS)}: it is not a run's config; "
            "start it with `defaults: [train, _self_]` to build on this project's, then set what you change"
        )


def check_composed(cfg: DictConfig) -> None:
    """What Hydra lets through a composition and a run cannot take: a key of the schema deleted (`~seed`), a key
    added inside a typed group (`+trainer.acclerator=gpu`). Every job checks it, on whatever process it starts
    (Hydra's node, if there, is Hydra's to check)."""
    check_run_keys(cfg)
    if deleted := _deleted_from_the_schema(cfg):
        name, group = deleted
        instead = f"set its keys ({name}.KEY=...) instead" if group else f"give it a value ({name}=...)"
        raise UserError(f"~{name} deletes {name}, which every run reads; {instead}")
    if unknown := _added_to_a_schema(cfg):
        raise UserError(planned_trainer_key(unknown) or unknown_key(unknown))
    if unresolved := _unresolvable(cfg):
        raise UserError(unresolved)


def _unresolvable(cfg: DictConfig) -> str | None:
    """The first interpolation of the config that names an environment variable not set or a key that is not
    there, said with its fix; the others (Hydra's `${hydra:...}` before Hydra runs the job) are left to resolve
    where they are read."""
    from omegaconf import ListConfig
    from omegaconf.errors import InterpolationKeyError, InterpolationResolutionError

    def walk(node: Any, path: str) -> str | None:  # a DictConfig or a ListConfig
        keys: list[Any] = (
            list(range(len(node))) if isinstance(node, ListConfig) else [k for k in node if k != "hydra" or path]
        )
        for key in keys:
            where = f"{path}[{key}]" if isinstance(node, ListConfig) else f"{path}{'.' if path else ''}{key}"
            if OmegaConf.is_missing(node, key):
                continue
            if not OmegaConf.is_interpolation(node, key):
                child = node[key]
                if isinstance(child, DictConfig | ListConfig) and (found := walk(child, where)):
                    return found
                continue
            try:
                node[key]
            except InterpolationKeyError as err:
                return f"{where}={_as_written(node, key)} names {_missing_key(str(err))}, which is not in the config; fix the name"
            except InterpolationResolutionError as err:
                if variable := re.search(r"Environment variable '([^']+)' not found", str(err)):
                    return (
                        f"{where}={_as_written(node, key)} reads the environment variable {variable[1]}, which is not set; set "
                        f"it, or give {where} a value"
                    )
        return None

    return walk(cfg, "")


def _as_written(node: Any, key: Any) -> Any:
    """An interpolation as written (read only for a refusal: a copy of its node, unresolved)."""
    return OmegaConf.to_container(node, resolve=False)[key]  # type: ignore[index]


def _missing_key(message: str) -> str:
    found = re.search(r"Interpolation key '([^']+)' not found", message)
    return found[1] if found else "a key"


def _deleted_from_the_schema(cfg: DictConfig) -> tuple[str, bool] | None:
    """A top-level key of the run's schema that a `~key` override deleted (Hydra lets it through, and the run
    would fail where it reads it), other than those whose absence means nothing given (`ckpt_path`, ...)."""
    from hydralight.config.schema import TrainConf

    for field in dataclasses.fields(TrainConf):
        if field.default is not None and field.name not in cfg:
            return field.name, field.default is dataclasses.MISSING  # a group (made by its default_factory)
    return None


def _added_to_a_schema(cfg: DictConfig) -> str | None:
    """A key that `+key=value` added inside a typed group (Hydra lets it through): the first one found. New
    top-level keys stay allowed: a namespace of your own harms nothing."""

    def walk(node: Any, path: str) -> str | None:
        if not isinstance(node, DictConfig):
            return None
        kind = OmegaConf.get_type(node)
        typed = dataclasses.is_dataclass(kind) and not ("_target_" in node and _replaced_target(node))
        names = {f.name for f in dataclasses.fields(kind)} if kind is not None and typed else None
        for key, value in node.items_ex(resolve=False):  # interpolations unresolved (`${now:...}`, `???`)
            where = path + str(key)
            if where == "hydra":
                continue  # Hydra's node, which Hydra checks
            if names is not None and path and key not in names:
                return where
            if names is not None and (found := walk(value, f"{where}.")):
                return found
        return None

    return walk(cfg, "")
