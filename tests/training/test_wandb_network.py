"""Weights & Biases against servers that do not help (one that accepts connections and never answers, a proxy
answering 404 to everything, a key the server refuses): every network step has a deadline; `auto` logs offline
and says so in one line, `online` is refused in one line."""

import socket
import sys
import time

import pytest
from conftest import HELPERS, TINY, one_line, run_cli

sys.path.insert(0, str(HELPERS))
from unhelpful_servers import answering_server, silent_server  # noqa: E402
from wandb_file import records  # noqa: E402

from hydralight.errors import UserError  # noqa: E402
from hydralight.training.loggers import wandb_mode, wandb_server_unreachable  # noqa: E402

FAKE_KEY = "0123456789abcdef0123456789abcdef01234567"
# The servers are on the loopback address: no proxy of the shell's may stand between them and the run.
LOOPBACK = {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
# Far more than these runs take, far less than wandb's own waits (90 s for wandb.init, more when retrying):
# a guard against hangs, not a timing.
HANG_GUARD_S = 80


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wandb_cli(tmp_path, data, url, *extra, **env):
    """`python train.py logger=wandb` with a (fake) API key and the server at `url`; its run dir, result and
    duration."""
    run = tmp_path / "run"
    env = {"WANDB_API_KEY": FAKE_KEY, "WANDB_BASE_URL": url, "WANDB_SILENT": "true", **LOOPBACK, **env}
    began = time.monotonic()
    result = run_cli([*TINY, "logger=wandb", *extra], run, data, timeout=2 * HANG_GUARD_S, HOME=str(tmp_path), **env)
    return run, result, time.monotonic() - began


def assert_logged_offline(run, result, took, says):
    assert result.returncode == 0, result.stderr[-2000:]
    notes = [line for line in result.stderr.splitlines() if "logging offline instead" in line]
    assert len(notes) == 1, result.stderr[-2000:]
    assert says in notes[0] and "wandb sync" in notes[0], notes[0]
    (path,) = (run / "wandb").glob("offline-run-*/run-*.wandb")
    kinds = {r.WhichOneof("record_type") for r in records(path)}
    assert {"run", "history", "exit"} <= kinds
    assert took < HANG_GUARD_S


@pytest.mark.slow
@pytest.mark.parametrize(
    "server, says",
    [(silent_server, "did not answer within 5 s"), (answering_server, "answered HTTP 404")],
    ids=["accepts-never-answers", "answers-404"],
)
def test_auto_logs_offline_when_the_server_does_not_answer(tiny_data, tmp_path, server, says):
    with server() as url:
        run, result, took = wandb_cli(tmp_path, tiny_data, url)
    assert_logged_offline(run, result, took, f"{url} {says}")


@pytest.mark.slow
def test_auto_logs_offline_when_the_online_run_cannot_start(tiny_data, tmp_path):
    # The server answers the probe, then refuses the key: the run starts again offline.
    with answering_server(401, b'{"errors": [{"message": "unauthorized"}]}') as url:
        run, result, took = wandb_cli(tmp_path, tiny_data, url)
    assert_logged_offline(run, result, took, "could not start an online run")


@pytest.mark.slow
@pytest.mark.parametrize(
    "server, says, how, switch",
    [
        (
            silent_server,
            "did not answer within 5 s",
            {"extra": ["logger.wandb.mode=online"]},
            "logger.wandb.mode=offline",
        ),
        (answering_server, "answered HTTP 404", {"env": {"WANDB_MODE": "online"}}, "WANDB_MODE=offline"),
    ],
    ids=["accepts-never-answers", "answers-404"],
)
def test_online_is_refused_in_one_line_when_the_server_does_not_answer(tiny_data, tmp_path, server, says, how, switch):
    with server() as url:
        run, result, took = wandb_cli(tmp_path, tiny_data, url, *how.get("extra", []), **how.get("env", {}))
    line = one_line(result)
    assert f"{url} {says}" in line and switch in line and "WANDB_BASE_URL" in line, line
    assert not list(run.glob("wandb/*run-*"))
    assert took < HANG_GUARD_S


@pytest.mark.slow
def test_online_start_has_a_deadline(tiny_data, tmp_path):
    # The probe gets its answer, wandb.init's requests none: wandb alone would wait 90 s.
    with answering_server(200, b'{"data": {"__typename": "Query"}}', answers=1) as url:
        _, result, took = wandb_cli(tmp_path, tiny_data, url, "logger.wandb.mode=online")
    line = one_line(result)
    assert "could not start a run" in line and "logger.wandb.mode=offline" in line, line
    assert took < HANG_GUARD_S


@pytest.fixture()
def loopback(monkeypatch):
    for name, value in LOOPBACK.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def test_probe_needs_an_answer_from_a_wandb_api(loopback):
    def verdict(url, timeout=2.0):
        loopback.setenv("WANDB_BASE_URL", url)
        return wandb_server_unreachable(timeout=timeout)

    assert "cannot be reached (Connection refused)" in verdict(f"http://127.0.0.1:{closed_port()}")
    with silent_server() as url:
        began = time.monotonic()
        assert verdict(url, timeout=1) == f"{url} did not answer within 1 s"
        assert time.monotonic() - began < 10
    with answering_server(404) as url:
        assert "answered HTTP 404" in verdict(url)
        # The address it names carries no password of the URL's.
        assert "hunter2" not in verdict(url.replace("//", "//me:hunter2@"))
    with answering_server(503, b"down") as url:
        assert "answered HTTP 503" in verdict(url)
    for status in (200, 400, 401):
        with answering_server(status, b"{}") as url:
            assert verdict(url) is None, status


def test_explicit_online_is_refused_and_auto_falls_back(loopback, capsys):
    loopback.setenv("WANDB_API_KEY", FAKE_KEY)
    with answering_server(404) as url:
        loopback.setenv("WANDB_BASE_URL", url)
        assert wandb_mode("auto") == "offline"
        assert capsys.readouterr().err.count("logging offline instead") == 1
        with pytest.raises(UserError, match="logger.wandb.mode=offline"):
            wandb_mode("online")
        loopback.setenv("WANDB_MODE", "online")
        with pytest.raises(UserError, match="WANDB_MODE=offline"):
            wandb_mode("auto")
        assert wandb_mode("offline") == "offline"  # the config's mode wins, and needs no server


def test_auto_without_a_login_is_offline_without_asking_a_server(loopback, tmp_path):
    loopback.delenv("WANDB_API_KEY", raising=False)
    loopback.setenv("NETRC", str(tmp_path / "no-netrc"))
    with silent_server() as url:
        loopback.setenv("WANDB_BASE_URL", url)
        began = time.monotonic()
        assert wandb_mode("auto") == "offline"
        assert time.monotonic() - began < 3  # no probe: it would have waited 5 s
