"""What the ranks of a torchrun launch tell each other before their process group exists."""

import threading
import time
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from hydralight.training.torchrun import start_up_ended, wait_for_rank_zero


@pytest.fixture
def agent_store(monkeypatch):
    """A store served as torchrun's agent serves it, and the variables torchrun gives its ranks."""
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    return store


def test_a_refusing_rank_exits_only_once_rank_zero_has_cleaned_up(agent_store):
    ended = []
    waiter = threading.Thread(target=lambda: (wait_for_rank_zero(timeout_s=30), ended.append(time.monotonic())))
    waiter.start()
    time.sleep(1.0)
    assert waiter.is_alive() and not ended  # rank 0 is still cleaning up: the other rank waits
    told = time.monotonic()
    start_up_ended()
    waiter.join(timeout=10)
    assert ended and ended[0] >= told


def test_the_wait_is_bounded_when_rank_zero_never_says(agent_store):
    started = time.monotonic()
    wait_for_rank_zero(timeout_s=0.5)
    assert time.monotonic() - started < 10


def test_a_restarted_launch_does_not_read_the_word_of_its_earlier_attempt(agent_store, monkeypatch):
    start_up_ended()  # attempt 0 refused
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert not agent_store.check(["hydralight/start-up-ended/1"])
    started = time.monotonic()
    wait_for_rank_zero(timeout_s=1.0)
    assert time.monotonic() - started >= 0.9  # it waited for attempt 1's rank 0


def test_nothing_is_awaited_outside_torchrun(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    started = time.monotonic()
    wait_for_rank_zero(timeout_s=30)
    start_up_ended()
    assert time.monotonic() - started < 5
