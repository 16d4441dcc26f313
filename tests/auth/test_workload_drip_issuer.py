"""An issuer that answers one byte at a time must not hold a key fetch past its timeout.

urllib's timeout bounds each socket read, not the whole answer: a discovery endpoint or JWKS that
trickles its document (a byte just inside the timeout, again and again) would keep the fetching
thread - and, before the fetch moved out of the key set's lock, every verification - waiting for
as long as it likes. ``Fetcher.timeout`` must bound the whole GET.

Finding: an issuer trickling a byte at a time held the key fetch past its timeout (failed before the
fix).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from raftgate.workload_identity import Fetcher

BODY = b'{"keys": [], "padding": "' + b"x" * 40 + b'"}'
#: the server's pause between bytes, and the fetch timeout (the whole answer takes 8 timeouts)
PAUSE_SECONDS = 0.05
TIMEOUT_SECONDS = PAUSE_SECONDS * len(BODY) / 8


@pytest.fixture
def dripping_url() -> Iterator[str]:
    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            try:
                for i in range(len(BODY)):
                    if stop.is_set():
                        return
                    self.wfile.write(BODY[i : i + 1])
                    self.wfile.flush()
                    time.sleep(PAUSE_SECONDS)
            except OSError:
                pass  # the client gave up: what the fix does

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/openid/v1/jwks"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_trickled_answer_fails_the_fetch_instead_of_outlasting_its_timeout(dripping_url: str) -> None:
    with pytest.raises(OSError):
        Fetcher(timeout=TIMEOUT_SECONDS).get(dripping_url)
