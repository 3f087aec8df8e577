"""What the ranks of a torchrun launch tell each other when they refuse their run, through a store served as
torchrun's agent serves it."""

import threading
import time
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from hydralight.training.torchrun import others_refused, refused, start_up_ended


@pytest.fixture
def agent_store(monkeypatch):
    """A store served as torchrun's agent serves it, and the variables torchrun gives its ranks."""
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    return store


def in_thread(fn, *args):
    ended: list[float] = []
    thread = threading.Thread(target=lambda: (fn(*args), ended.append(time.monotonic())), daemon=True)
    thread.start()
    return thread, ended


def test_rank_zero_cleans_up_once_every_other_rank_refused_and_they_exit_after_it(agent_store):
    rank0, rank0_ready = in_thread(others_refused, 30)
    rank1, rank1_ended = in_thread(refused, 30)
    time.sleep(1.0)
    assert not rank0_ready  # rank 2 has not refused yet: its Hydra may still make the run dir
    rank2, rank2_ended = in_thread(refused, 30)
    rank0.join(timeout=10)
    assert rank0_ready
    time.sleep(0.5)
    assert not rank1_ended and not rank2_ended  # rank 0 is cleaning up: they wait
    told = time.monotonic()
    start_up_ended()
    rank1.join(timeout=10)
    rank2.join(timeout=10)
    assert rank1_ended and rank2_ended and min(rank1_ended + rank2_ended) >= told


def test_the_waits_are_bounded_when_a_rank_never_says(agent_store):
    started = time.monotonic()
    others_refused(timeout_s=0.5)  # the others went on to their process group
    refused(timeout_s=0.5)  # rank 0 was stopped before it could say
    assert time.monotonic() - started < 10


def test_a_restarted_launch_does_not_read_the_word_of_its_earlier_attempt(agent_store, monkeypatch):
    start_up_ended()  # attempt 0 refused
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    started = time.monotonic()
    refused(timeout_s=1.0)
    assert time.monotonic() - started >= 0.9  # it waited for attempt 1's rank 0


def test_nothing_is_awaited_outside_torchrun(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    started = time.monotonic()
    others_refused(timeout_s=30)
    refused(timeout_s=30)
    start_up_ended()
    assert time.monotonic() - started < 5
