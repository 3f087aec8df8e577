"""Servers on 127.0.0.1 that a client cannot get anything useful from, for tests of network deadlines.

`silent_server()` accepts every connection and never sends a byte; `answering_server()` gives every HTTP request
the same answer (a 404 by default, as a proxy in front of nothing does), or only the first few of them and then
goes quiet. Each runs in daemon threads, yields its base URL, and
stops when its `with` block ends or after `lifetime` seconds, whichever comes first, so a test that forgets
it or dies midway leaves nothing listening for long.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextlib.contextmanager
def silent_server(lifetime: float = 120) -> Iterator[str]:
    """`http://127.0.0.1:PORT` of a server that accepts connections, reads nothing and answers nothing."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    listener.settimeout(0.2)  # so the accepting thread sees `stop` soon after it is set
    stop = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                held.append(listener.accept()[0])  # kept open, never read or written
        for connection in held:
            connection.close()
        listener.close()

    thread = threading.Thread(target=accept, name="silent-server", daemon=True)
    thread.start()
    timer = threading.Timer(lifetime, stop.set)
    timer.daemon = True
    timer.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        timer.cancel()
        stop.set()
        thread.join(5)


class _SameAnswer(BaseHTTPRequestHandler):
    status = 404
    body = b"not found\n"
    answers: int | None = None  # requests answered before the server goes quiet; None: all
    stopped: threading.Event
    lock: threading.Lock

    def _answer(self) -> None:
        with self.lock:
            quiet = self.answers is not None and self.answers <= 0
            if self.answers is not None:
                type(self).answers = self.answers - 1
        if quiet:
            self.stopped.wait()  # holds the connection, answers nothing
            return
        body = self.body
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json" if body.startswith(b"{") else "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_HEAD = do_PATCH = do_DELETE = do_OPTIONS = _answer

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test's output is the client's."""


@contextlib.contextmanager
def answering_server(
    status: int = 404, body: bytes = b"not found\n", answers: int | None = None, lifetime: float = 120
) -> Iterator[str]:
    """`http://127.0.0.1:PORT` of an HTTP server that answers every request (or the first `answers` requests)
    with `status` and `body`."""
    stopped = threading.Event()
    fields = {"status": status, "body": body, "answers": answers, "stopped": stopped, "lock": threading.Lock()}
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Answer", (_SameAnswer,), fields))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    thread.start()
    once = threading.Lock()  # the timer and the `with` block may both stop it

    def stop() -> None:
        if once.acquire(blocking=False):
            stopped.set()
            server.shutdown()
            server.server_close()

    timer = threading.Timer(lifetime, stop)
    timer.daemon = True
    timer.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        timer.cancel()
        stop()
        thread.join(5)
