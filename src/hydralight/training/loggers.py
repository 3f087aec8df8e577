"""The run's metric history (csv/metrics.csv, written with every logger, kept across resumes) and the
experiment trackers `logger=` adds beside it: TensorBoard, Weights & Biases, MLflow."""

from __future__ import annotations

import base64
import contextlib
import csv
import hashlib
import http.client
import io
import os
import shutil
import ssl
import sys
import threading
import urllib.error
import urllib.request
from argparse import Namespace
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from lightning_fabric.utilities.rank_zero import rank_zero_only
from pytorch_lightning.loggers import Logger, MLFlowLogger, WandbLogger

from hydralight.config.plan import RunPlan
from hydralight.errors import UserError, require
from hydralight.rundir.launch import is_rank_zero
from hydralight.rundir.layout import RunDir
from hydralight.rundir.redaction import redact, redacted_argv

HISTORY_TARGET = "hydralight.training.loggers.HistoryLogger"


class HistoryLogger(Logger):
    """Every logged metric of a run, one row per logged step, in `<run dir>/csv/metrics.csv`, kept across the
    attempts of the run (resumes, requeues, the test stage of `ddp_spawn`): an attempt resumed from step S
    replaces the rows logged at S or later, so every step is in the file once. Rows reach the disk as they
    are logged, so a kill loses none before the last checkpoint.

    Written on Lightning's public Logger API: its CSVLogger deletes an existing file when it starts and
    forgets the file's columns in a new process.
    """

    def __init__(self, run_dir: str) -> None:
        super().__init__()
        self.path = RunDir.at(run_dir).history
        self._run_dir = run_dir
        self._columns: list[str] | None = None
        # While set, the epoch its rows are written with in place of the one Lightning passes (its counter is
        # one ahead during the final validation of a run stopped between validations: training.epochs).
        self.epoch_of_rows: int | None = None
        # While set, the step its rows are written with (the test of an attempt that continued a finished training).
        self.step_of_rows: int | None = None

    @property
    def name(self) -> str:
        return "csv"

    @property
    def version(self) -> str:
        return ""

    @property
    def root_dir(self) -> str:
        return self._run_dir

    @property
    def log_dir(self) -> str:
        return str(self.path.parent)

    @property
    def save_dir(self) -> str:
        return self._run_dir

    def _header(self) -> list[str]:
        if self._columns is None:
            self._columns = []
            if self.path.is_file():
                with self.path.open(newline="") as f:
                    self._columns = next(csv.reader(f), [])
        return self._columns

    def _rows(self) -> list[dict[str, str]]:
        if not self.path.is_file():
            return []
        with self.path.open(newline="") as f:
            return list(csv.DictReader(f))

    def _rewrite(self, columns: list[str], rows: Sequence[Mapping[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with temporary.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=columns)
                writer.writeheader()
                writer.writerows(rows)
            os.replace(temporary, self.path)
        except OSError as err:  # a full disk: the history as it was, and a line that names it
            temporary.unlink(missing_ok=True)
            raise OSError(err.errno, err.strerror, str(self.path)) from err
        self._columns = columns

    def _append(self, columns: list[str], row: Mapping[str, Any]) -> None:
        line = io.StringIO()
        csv.DictWriter(line, fieldnames=columns).writerow(row)
        data = line.getvalue().encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            end = os.fstat(fd).st_size
            try:
                while data:
                    data = data[os.write(fd, data) :]
            except OSError as err:
                # A row cut short by a full disk would read as another step's row: the file ends where it did.
                os.ftruncate(fd, end)
                raise OSError(err.errno, err.strerror, str(self.path)) from err
        finally:
            os.close(fd)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        step = step if self.step_of_rows is None else self.step_of_rows
        row = {"step": step, **{k: (v.item() if hasattr(v, "item") else v) for k, v in metrics.items()}}
        if self.epoch_of_rows is not None and "epoch" in row:
            row["epoch"] = self.epoch_of_rows
        columns = self._header()
        new = [k for k in row if k not in columns]
        if new or not self.path.is_file():
            # A new column (the first validation, the test): the file is written again with it.
            self._rewrite([*columns, *new], [*self._rows(), row])
            return
        self._append(columns, row)

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        """The run's config and plan are in config.yaml and plan.yaml already."""

    def row_count(self) -> int:
        return len(self._rows())

    def latest_values(self) -> dict[str, float]:
        """The last value logged of each metric (what Lightning's `callback_metrics` held for the loggers)."""
        latest: dict[str, float] = {}
        for row in self._rows():
            for key, value in row.items():
                if key not in ("step", "epoch") and value not in (None, ""):
                    with contextlib.suppress(ValueError):
                        latest[key] = float(value)
        return latest

    @rank_zero_only
    def keep_rows(self, count: int) -> None:
        """Keep the first `count` rows (what the history held when training ended): rows an attempt killed
        after its training logged (its test) are logged again by the attempt that continues it."""
        rows = self._rows()
        if len(rows) > count:
            self._rewrite(self._header(), rows[:count])

    @rank_zero_only
    def forget_from_step(self, step: int) -> None:
        """Drop the rows logged at `step` or later (by an attempt that did not reach its next checkpoint)."""
        rows = self._rows()
        kept = [row for row in rows if row.get("step") in (None, "") or int(float(row["step"])) < step]
        if len(kept) != len(rows):
            self._rewrite(self._header(), kept)


# Every network step of a wandb run has a deadline, so that a server that accepts connections and never
# answers (a firewall, a dead proxy) costs seconds, not wandb's own minutes.
WANDB_PROBE_S = 5.0  # for the server to answer one request
WANDB_INIT_TIMEOUT_S = 15.0  # for wandb.init to start the run (wandb's default: 90 s)
WANDB_FINISH_TIMEOUT_S = 300.0  # for the last uploads; what is left stays on disk for `wandb sync`
WANDB_ONLINE_MODES = ("online", "shared", "run")
WandbMode = Literal["online", "offline", "shared", "disabled", "dryrun", "run"]
WANDB_MODES: tuple[WandbMode, ...] = ("online", "offline", "shared", "disabled", "dryrun", "run")
OFFLINE_NOTE = "logging offline instead (upload later with `wandb sync <run dir>/wandb/offline-run-*`)"


def wandb_base_url() -> str:
    return os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").rstrip("/")


def explicit_wandb_mode(requested: str) -> str | None:
    """The mode the config (`logger.wandb.mode`) or the environment (`WANDB_DISABLED`, `WANDB_MODE`) asks for;
    None when `auto` leaves the choice to the run."""
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_DISABLED", "").lower() in ("1", "true", "yes"):
        return "disabled"
    return os.environ.get("WANDB_MODE") or None


def offline_switch(requested: str) -> str:
    """How the user turns a run of this request offline: the config's mode wins over WANDB_MODE."""
    return "WANDB_MODE=offline" if requested == "auto" else "logger.wandb.mode=offline"


def known_wandb_mode(mode: str) -> WandbMode:
    """`mode` as wandb's settings take it; one wandb does not know is refused in one line."""
    for known in WANDB_MODES:
        if mode == known:
            return known
    raise UserError(
        f"wandb has no mode {mode} (from logger.wandb.mode or WANDB_MODE); use auto or one of {', '.join(WANDB_MODES)}"
    )


def wandb_mode(requested: str) -> str:
    """The mode of the run's wandb logger: the one asked for (`explicit_wandb_mode`), else (`auto`) online only
    when an API key is configured and the server answers within `WANDB_PROBE_S` seconds, so a run never prompts
    for a login or hangs on a compute node without internet. Online asked for with a server that does not answer
    is refused in one line."""
    explicit = explicit_wandb_mode(requested)
    if explicit is not None and explicit not in WANDB_ONLINE_MODES:
        return explicit
    if explicit is None and not _has_login():
        return "offline"
    unreachable = wandb_server_unreachable()
    if unreachable is None:
        return explicit or "online"
    if explicit is not None:
        raise UserError(
            f"wandb: {unreachable}; log offline with {offline_switch(requested)} (upload later with `wandb sync`), "
            "or check WANDB_BASE_URL and your login (`wandb login`)"
        )
    print(f"wandb: {unreachable}; {OFFLINE_NOTE}", file=sys.stderr, flush=True)
    return "offline"


def _has_login() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlsplit(wandb_base_url()).hostname or "api.wandb.ai"
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return netrc.is_file() and host in netrc.read_text(errors="ignore")


def wandb_server_unreachable(timeout: float = WANDB_PROBE_S) -> str | None:
    """Why the wandb server (WANDB_BASE_URL) does not answer a request to its API within `timeout` seconds;
    None if it does.

    The probe is the request wandb starts a run with (a POST to /graphql; the query needs no login, and no key
    is sent). Any answer counts but a 404, which no wandb server gives there (a proxy answering for a server it
    cannot reach, a wrong WANDB_BASE_URL), and a server error, which wandb would keep retrying.
    """
    base = wandb_base_url()
    parts = urlsplit(base)
    # The address as the message names it, without any user:password the URL carries.
    where = f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    request = urllib.request.Request(
        f"{base}/graphql",
        data=b'{"query": "{ __typename }"}',
        headers={"Content-Type": "application/json", "User-Agent": "hydralight"},
        method="POST",
    )
    return unanswered(request, where, timeout)


def unanswered(
    request: urllib.request.Request, where: str, timeout: float, service: str = "wandb", setting: str = "WANDB_BASE_URL"
) -> str | None:
    """Why `request` gets no useful answer within `timeout` seconds (no connection, silence, a 404 or a server
    error), in words naming `where` (a `service` server, named by `setting`); None if it does. Written by hand:
    urllib's timeout bounds each socket operation, not the whole request, and not name resolution."""
    outcome: list[str | None] = []
    silent = f"{where} did not answer within {timeout:.0f} s"

    def probe() -> None:  # in a thread: name resolution has no timeout of its own
        try:
            with urllib.request.urlopen(request, timeout=timeout):
                outcome.append(None)
        except urllib.error.HTTPError as err:
            outcome.append(_refusal(where, err.code, service, setting))
        except urllib.error.URLError as err:
            if isinstance(err.reason, ssl.SSLCertVerificationError):
                outcome.append(None)  # it answered; which certificates to trust is wandb's own setting
            elif isinstance(err.reason, TimeoutError):
                outcome.append(silent)  # the socket's deadline, met before the thread's: the same silence
            else:
                outcome.append(f"{where} cannot be reached ({_reason(err.reason)})")
        except TimeoutError:
            outcome.append(silent)
        except (OSError, ValueError, http.client.HTTPException) as err:  # resets, a malformed URL
            outcome.append(f"{where} cannot be reached ({_reason(err)})")

    thread = threading.Thread(target=probe, name="wandb-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else silent


def _refusal(where: str, status: int, service: str, setting: str) -> str | None:
    if status == 404:
        return (
            f"{where} answered HTTP 404 to the {service} API: no {service} server there (a proxy, or a wrong {setting})"
        )
    if status == 407:
        return f"{where} is a proxy that wants a login (HTTP 407)"
    if status >= 500:
        return f"{where} answered HTTP {status} (a server error)"
    return None  # 2xx-4xx: a server that speaks wandb's API, whether or not it takes this request


def _reason(err: object) -> str:
    # Hydra's instantiate wraps the constructor's error ("Error in call to target '...':"): the cause says why.
    while isinstance(err, BaseException) and str(err).startswith("Error in call to target") and err.__cause__:
        err = err.__cause__
    text = getattr(err, "strerror", None) or str(err).strip() or type(err).__name__
    return text.splitlines()[0][:200]


def sweep_group(sweep_dir: str | None) -> str | None:
    """A sweep's group in a tracker: its dir's last two folders (`2026-12-05/11-00-00-123456` of the default
    layout; the time alone would gather the sweeps of different days started at the same second)."""
    return "/".join(Path(sweep_dir).parts[-2:]) if sweep_dir else None


def wandb_settings(spec: dict[str, Any], plan: RunPlan, mode: str, lineage: str = "") -> dict[str, Any]:
    """One wandb run per training: an id from the job dir and its `lineage` (the manifest's: a requeued or
    resumed job continues its run, a fresh start in the same dir gets a new one), grouped by sweep, named by
    its overrides, tagged with the hardware, with deadlines for starting and finishing it (the spec's
    `settings` win)."""
    import wandb

    hw, fw, paths = plan.hardware, plan.framework, plan.paths
    tags = [f"{hw.num_nodes}x{hw.devices}{hw.accelerator}", fw.strategy, fw.precision]
    run_dir = Path(paths.run_dir)
    known = wandb.Settings()  # older releases lack some of these, and refuse settings they do not know
    deadlines = {"init_timeout": WANDB_INIT_TIMEOUT_S, "finish_timeout": WANDB_FINISH_TIMEOUT_S}
    deadlines = {name: seconds for name, seconds in deadlines.items() if hasattr(known, name)}
    # The name comes from the command line, which may carry a secret's value: what wandb records is redacted.
    # Its settings (an api_key among them) are what it runs with, not what it records: passed as given.
    recorded = redact(
        {
            **{k: v for k, v in spec.items() if k != "settings"},
            "mode": mode,
            "id": spec.get("id") or hashlib.sha1(f"{run_dir.resolve()}{lineage}".encode()).hexdigest()[:16],
            "resume": "allow",
            "group": spec.get("group") or sweep_group(paths.sweep_dir),
            "name": spec.get("name") or paths.job_name or run_dir.name,
            "tags": list(dict.fromkeys([*spec.get("tags", []), *(plan.config.get("tags") or []), *tags])),
            "_convert_": "all",  # wandb.init takes its settings as a plain dict, not Hydra's DictConfig
        }
    )
    return {**recorded, "settings": {**deadlines, **(spec.get("settings") or {})}}


def build_loggers(plan: RunPlan, manifest: dict[str, Any] | None = None) -> list[Logger]:
    """The history, then every logger under `logger.*`; each tracker gets the resolved config, the plan and
    (wandb) the run manifest."""
    from hydralight.config.binding import bind, import_target, instantiate

    loggers: list[Logger] = [HistoryLogger(plan.paths.run_dir)]
    lineage = (manifest or {}).get("lineage", "")  # which training of the run dir this is (RunRecord's)
    for name, spec in plan.loggers.items():
        if spec.get("_target_") == HISTORY_TARGET:
            continue  # always there
        if name == "wandb":
            loggers.append(start_wandb_logger(spec, plan, lineage))
            continue
        if name == "mlflow":
            loggers.append(start_mlflow_logger(spec, plan, lineage))
            continue
        if name == "tensorboard":
            require("tensorboard", "tensorboard", "logger=tensorboard")
            if spec.get("version") in ("", None):  # one folder per training: a fresh start never mixes in
                spec = {**spec, "version": hashlib.sha1(str(lineage).encode()).hexdigest()[:8]}
        # A logger of the user's: its arguments checked as a callback's are, its files in the run dir unless it
        # says otherwise; what its constructor refuses is one line.
        target = import_target(str(spec.get("_target_")), f"logger.{name}._target_")
        given = bind(target, spec, {"save_dir": plan.paths.run_dir, "run_dir": plan.paths.run_dir}, f"logger.{name}")
        loggers.append(instantiate(spec, **given))
    hparams = redact({"config": plan.config, "plan": plan.to_dict()})
    for logger in loggers[1:]:
        logger.log_hyperparams(hparams)
        if manifest and isinstance(logger, WandbLogger):
            logger.experiment.config.update({"manifest": redact(manifest)}, allow_val_change=True)
    return loggers


# MLflow's client retries a request 7 times with backoff, each with a 120 s deadline: minutes of a job waiting
# on a server that went away. These bound it unless the environment sets them.
MLFLOW_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "15", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2"}
MLFLOW_PROBE_S = 5.0
MLFLOW_LOCAL = "mlflow"  # the run dir's own store: mlflow/mlflow.db and its artifacts beside it
MLFLOW_RUN_DIR_TAG = "hydralight.run_dir"
MLFLOW_LINEAGE_TAG = "hydralight.lineage"


class MLflowRunLogger(MLFlowLogger):
    """Lightning's MLFlowLogger, continuing a run's MLflow run across attempts: MLflow refuses to change a
    logged param, so a continued run logs the params it did not have, and each changed value (a larger
    `trainer.max_steps`) as a tag `changed/<param>`. An attempt refused before it saved anything puts the run's
    status back (`put_back`): Lightning marks it failed as the refusal leaves `fit`."""

    _status_before: str | None = None

    @property
    def experiment(self) -> Any:
        client = super().experiment
        if self._status_before is None and self._run_id is not None:  # (its run_id property reads experiment)
            self._status_before = client.get_run(self._run_id).info.status  # RUNNING for a run it just started
        return client

    @rank_zero_only
    def put_back(self) -> None:
        if self._status_before not in (None, "RUNNING"):
            self.experiment.set_terminated(self.run_id, self._status_before)

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace) -> None:
        from mlflow.entities import Param

        flat = {
            key: str(value)[:MLFLOW_PARAM_CHARS]
            for key, value in _flattened(vars(params) if isinstance(params, Namespace) else params)
        }
        logged = self.experiment.get_run(self.run_id).data.params
        new = [Param(key, value) for key, value in flat.items() if key not in logged]
        for start in range(0, len(new), 100):  # MLflow takes at most 100 params a request
            self.experiment.log_batch(run_id=self.run_id, params=new[start : start + 100])
        for key, value in flat.items():
            if key in logged and logged[key] != value:
                self.experiment.set_tag(self.run_id, f"changed/{key}", value)


# MLflow keeps a param's first 6,000 characters (250 in older servers): what Lightning's logger sends.
MLFLOW_PARAM_CHARS = 250


def _flattened(params: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """`{"config": {"optim": {"lr": 1}}}` as `("config/optim/lr", 1)`, as Lightning's loggers name params."""
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from _flattened(value, f"{name}/")
        else:
            yield name, value


def start_mlflow_logger(spec: dict[str, Any], plan: RunPlan, lineage: str = "") -> Logger:
    """The MLflow logger of `spec`: one MLflow run per training of a job (tagged with its run dir and `lineage`,
    so a resumed or requeued job continues it and a fresh start in the same dir gets its own; a sweep's jobs
    tagged with the sweep), on the tracking server of `tracking_uri` or
    MLFLOW_TRACKING_URI. A server that does not answer within 5 s, or none given, keeps the run in the run dir's
    own store (`mlflow/`), said in one line."""
    require("mlflow", "mlflow", "logger=mlflow")
    from hydra.utils import instantiate

    for name, value in MLFLOW_HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    run_dir = Path(plan.paths.run_dir).resolve()
    store = run_dir / MLFLOW_LOCAL
    local = f"sqlite:///{store / 'mlflow.db'}"  # MLflow 3 keeps a file store for old data only
    uri = spec.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI") or local
    why = "no tracking server set (MLFLOW_TRACKING_URI)"  # why the run is kept in the run dir's own store
    if uri.startswith(("http://", "https://")) and is_rank_zero():
        parts = urlsplit(uri)
        where = f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")
        # A login in the URL (user:password@host) goes in a header: urllib would take it for part of the host.
        headers = {"User-Agent": "hydralight"}
        if parts.username is not None:
            login = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(login).decode()
        health = urllib.request.Request(f"{where}{parts.path.rstrip('/')}/health", headers=headers)
        if (failure := unanswered(health, where, MLFLOW_PROBE_S, "MLflow", "MLFLOW_TRACKING_URI")) is not None:
            uri, why = local, failure
    hw, fw, paths = plan.hardware, plan.framework, plan.paths
    tags = {
        **(spec.get("tags") or {}),
        MLFLOW_RUN_DIR_TAG: str(run_dir),
        MLFLOW_LINEAGE_TAG: lineage,
        "hardware": f"{hw.num_nodes}x{hw.devices}{hw.accelerator}",
        "strategy": fw.strategy,
        "precision": fw.precision,
        **({"sweep": str(Path(paths.sweep_dir).resolve())} if paths.sweep_dir else {}),
        **{f"tag.{tag}": "true" for tag in plan.config.get("tags") or []},
    }
    settings = {
        **spec,
        "tracking_uri": uri,
        "run_name": spec.get("run_name") or paths.job_name or run_dir.name,
        "tags": tags,
        "run_id": spec.get("run_id") or (_earlier_mlflow_run(uri, spec, run_dir, lineage) if is_rank_zero() else None),
        # Where a new experiment of the run dir's own store keeps its artifacts (a server decides its own).
        "artifact_location": spec.get("artifact_location")
        or ((store / "artifacts").as_uri() if uri == local else None),
        "_convert_": "all",
    }
    if uri == local and is_rank_zero():
        store.mkdir(parents=True, exist_ok=True)
        print(f"mlflow: {why}; logging to {store} (view it with `mlflow ui --backend-store-uri {local}`)",
              file=sys.stderr, flush=True)  # fmt: skip
    try:
        logger = instantiate(redact(settings))  # the run's name comes from the command line: it may hold a secret
        if is_rank_zero():
            logger.experiment  # noqa: B018 (creates the experiment and starts the run)
    except Exception as err:  # MLflow's own exception types
        raise UserError(
            f"mlflow could not start a run on {uri} ({_reason(err)}); check MLFLOW_TRACKING_URI, or unset it to "
            f"keep the run in the run dir ({MLFLOW_LOCAL}/)"
        ) from None
    return logger


def _earlier_mlflow_run(uri: str, spec: dict[str, Any], run_dir: Path, lineage: str) -> str | None:
    """The MLflow run an earlier attempt of this training of the run dir started (a resume, a requeue), if the
    store has one."""
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name(spec.get("experiment_name") or "hydralight")
        if experiment is None:
            return None
        found = client.search_runs(
            [experiment.experiment_id],
            filter_string=f"tags.`{MLFLOW_RUN_DIR_TAG}` = '{run_dir}' and tags.`{MLFLOW_LINEAGE_TAG}` = '{lineage}'",
            max_results=1,
        )
    except Exception:  # no store yet, or one that cannot be searched: a new run
        return None
    return found[0].info.run_id if found else None


def start_wandb_logger(spec: dict[str, Any], plan: RunPlan, lineage: str = "") -> Logger:
    """The wandb logger of `spec` with its run started (`lineage`: see `wandb_settings`). In `auto` mode a run
    that cannot start online (the server answered the probe, then failed or went quiet) starts offline
    instead, said in one line."""
    import wandb
    from hydra.utils import instantiate

    if not is_rank_zero():
        # Lightning's logger starts no run on the other ranks: no probe, no second note, no wandb process.
        return instantiate(wandb_settings(spec, plan, "disabled"))
    requested = spec.get("mode", "auto")
    mode = wandb_mode(requested)
    # The process's mode too, not only the run's: wandb's own telemetry follows the process's settings, and
    # would otherwise try the server when the process exits (10 s and more when it does not answer).
    wandb.setup(wandb.Settings(mode=known_wandb_mode(mode)))
    logger = instantiate(wandb_settings(spec, plan, mode, lineage))
    put_back = _attempt_discarder(logger)
    failure = _start(logger)
    if failure is not None and mode == "online" and explicit_wandb_mode(requested) is None:
        wandb.teardown()  # the failed run still holds its id in wandb's service process
        print(f"wandb: could not start an online run ({failure}); {OFFLINE_NOTE}", file=sys.stderr, flush=True)
        wandb.setup(wandb.Settings(mode="offline"))
        logger = instantiate(wandb_settings(spec, plan, "offline", lineage))
        failure = _start(logger)
    if failure is not None:
        raise UserError(
            f"wandb could not start a run ({failure}); log offline with {offline_switch(requested)} (upload later "
            "with `wandb sync`), or check WANDB_BASE_URL and your login (`wandb login`)"
        )
    if put_back is not None:
        logger.put_back = put_back
    return logger


def _attempt_discarder(logger: Logger) -> Callable[[], None] | None:
    """What puts a wandb logger's folder back as it was before this attempt (called for an attempt refused before
    it saved anything): the run's folder this attempt made goes, which a later `wandb sync` would have sent to
    the run it continues with the refused attempt's config. A server the attempt reached keeps what it got."""
    if not isinstance(logger, WandbLogger) or not logger.save_dir:
        return None
    folder = Path(logger.save_dir) / "wandb"
    before = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
    latest = folder / "latest-run"
    pointed = os.readlink(latest) if latest.is_symlink() else None

    def put_back() -> None:
        import wandb

        if wandb.run is not None:
            wandb.finish(exit_code=1)
        for made in folder.glob("*run-*") if folder.is_dir() else ():
            if made.name not in before and made.is_dir() and not made.is_symlink():
                shutil.rmtree(made, ignore_errors=True)
        if latest.is_symlink() and os.readlink(latest) != pointed:
            latest.unlink()
            if pointed is not None:
                latest.symlink_to(pointed)

    return put_back


def _start(logger: Logger) -> str | None:
    """Start the logger's wandb run, with the command line's secrets out of what wandb records; why it could
    not, or None."""
    if not isinstance(logger, WandbLogger):
        return None  # another logger class in `logger.wandb`: it starts its own way
    try:
        with redacted_argv():
            logger.experiment  # noqa: B018 (starts the run)
    except Exception as err:  # wandb raises its own error types, and they move between releases
        return _reason(err)
    return None


@contextlib.contextmanager
def wandb_scope() -> Iterator[None]:
    """Close the job's wandb run when the job ends, so the next job of a sweep gets its own."""
    failed = True
    try:
        yield
        failed = False
    finally:
        wandb = sys.modules.get("wandb")
        if wandb is not None and wandb.run is not None:
            wandb.finish(exit_code=int(failed))
