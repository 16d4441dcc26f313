"""A proxy without the JSON gateway does not load aiohttp: the gateway's HTTP stack is most of a
proxy's import time (~180 ms of CPU at every start of a sidecar or a test's proxy), and only a
proxy started with --listen-gateway-urls uses it."""

from __future__ import annotations

import subprocess
import sys


def test_a_proxy_without_a_gateway_does_not_import_aiohttp() -> None:
    code = "import sys, proxy.main, proxy.server; print('aiohttp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
