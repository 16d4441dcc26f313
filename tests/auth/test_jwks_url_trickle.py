"""A ``jwks-url`` that trickles its answer must not hold the fetching thread past the timeout.

urllib's timeout bounds each socket read; the fetch checked its overall deadline only between
64 KiB reads. A JWKS URL answering a byte at a time (just inside the socket timeout) kept a thread
reading for hours; the follower gives up waiting after the timeout, so every unknown ``kid`` a
client sends (at most one fetch a second) left one more thread stuck, until the proxy's worker
threads were all taken and the periodic refresh never ran again. The fetch must let go of the
connection when its time is up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from raftgate import jwt_keys
from raftgate.jwt_keys import KeyLoadError

PAUSE_SECONDS = 0.05
TIMEOUT_SECONDS = 0.3
BODY_BYTES = 256 * 1024
#: generous: the fixed fetch lets go after TIMEOUT_SECONDS
BOUND_SECONDS = 10.0


class Trickle:
    def __init__(self) -> None:
        self.client_gone = threading.Event()
        self.stop = threading.Event()


@pytest.fixture
def trickle() -> Iterator[tuple[str, Trickle]]:
    state = Trickle()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(BODY_BYTES))
            self.end_headers()
            try:
                while not state.stop.is_set():
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(PAUSE_SECONDS)
            except OSError:
                state.client_gone.set()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/.well-known/jwks.json", state
    finally:
        state.stop.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_trickling_jwks_url_is_let_go_after_the_timeout(trickle: tuple[str, Trickle]) -> None:
    url, state = trickle
    errors: list[Exception] = []

    def fetch() -> None:
        try:
            jwt_keys.fetch(url, None, timeout=TIMEOUT_SECONDS)
        except KeyLoadError as e:
            errors.append(e)

    fetcher = threading.Thread(target=fetch, daemon=True)
    fetcher.start()
    assert state.client_gone.wait(BOUND_SECONDS), "the fetch still reads a trickling answer long past its timeout"
    fetcher.join(BOUND_SECONDS)
    assert len(errors) == 1
