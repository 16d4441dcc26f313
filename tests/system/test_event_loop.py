"""Which event loop the store and the proxy run on (``RAFTGATE_EVENT_LOOP``): uvloop unless told
otherwise, asyncio's own loop on request, and a clear refusal of anything else before a port is
opened (docs/performance.md: round 4 measured what uvloop pays)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raftgate import event_loop
from tests.support.processes import free_port, proxy_program, store_program, wait_serving


def _running_loop_module() -> str:
    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__.split(".")[0]

    return event_loop.run(which())


def test_uvloop_unless_asyncio_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(event_loop.ENV, raising=False)
    assert _running_loop_module() == "uvloop"
    monkeypatch.setenv(event_loop.ENV, "asyncio")
    assert _running_loop_module() == "asyncio"
    monkeypatch.setenv(event_loop.ENV, " UVLOOP ")
    assert _running_loop_module() == "uvloop"


@pytest.mark.parametrize("program", ["store", "proxy"])
def test_an_unknown_loop_is_refused_before_anything_starts(tmp_path: Path, program: str) -> None:
    store, internal = store_program(tmp_path)
    proxy = proxy_program(tmp_path, internal, f"http://127.0.0.1:{free_port()}")
    args = store.args if program == "store" else proxy.args
    env = {**os.environ, event_loop.ENV: "tokio"}
    done = subprocess.run([sys.executable, "-m", "raftgate.cli", *args], capture_output=True, text=True,
                          env=env, timeout=60, cwd=str(tmp_path))
    assert done.returncode == 2
    assert f"{event_loop.ENV}: 'tokio' is not one of uvloop, asyncio" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "store-data").exists()


def test_store_and_proxy_say_which_loop_they_run_and_serve_on_it(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(event_loop.ENV, raising=False)
    store, internal = store_program(tmp_path)
    store.start(timeout=60)
    monkeypatch.setenv(event_loop.ENV, "asyncio")  # inherited by the proxy started next
    listen = f"127.0.0.1:{free_port()}"
    proxy = proxy_program(tmp_path, internal, f"http://{listen}")
    try:
        proxy.start(timeout=60)
        wait_serving(listen)
        assert any("event loop: uvloop" in line for line in list(store.lines))
        assert any("event loop: asyncio" in line for line in list(proxy.lines))
    finally:
        proxy.stop()
        store.stop()


def test_a_uvloop_that_cannot_be_loaded_is_a_start_up_error(tmp_path: Path) -> None:
    """Installed but broken (a wheel for another platform, a missing shared library): the program
    says so at start-up, exit 2, before it opens anything, not with a traceback later."""
    broken = tmp_path / "site" / "uvloop"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('libuv.so: cannot open shared object file')\n")
    store, _ = store_program(tmp_path)
    env = {**os.environ, "PYTHONPATH": f"{broken.parent}:{os.environ.get('PYTHONPATH', '')}"}
    env.pop(event_loop.ENV, None)
    done = subprocess.run([sys.executable, "-m", "raftgate.cli", *store.args], capture_output=True, text=True,
                          env=env, timeout=60, cwd=str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert "uvloop cannot be loaded (libuv.so: cannot open shared object file)" in done.stderr
    assert f"{event_loop.ENV}=asyncio" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "store-data").exists()
