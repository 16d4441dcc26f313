"""``raftgate local``: a store node and a proxy on this machine, in the foreground.

Each runs as its own process (the same programs ``raftgate store`` and ``raftgate proxy`` start),
so a test or an operator can inspect or kill one of them: ``<data-dir>/local.json`` lists their
pids and ports while they run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import sys
from pathlib import Path

READY_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="raftgate local", description="Run a local raftgate (store + proxy) serving the etcd v3 API."
    )
    p.add_argument("--data-dir", default="./raftgate-data", help="where all state lives (default ./raftgate-data)")
    p.add_argument("--client-port", type=int, default=2379, help="etcd API port on 127.0.0.1 (default 2379)")
    p.add_argument("--nodes", type=int, default=1, choices=[1], help="store nodes (1 until replication lands)")
    p.add_argument(
        "--auth-token", default=None, help="simple (default) or jwt,pub-key=…,priv-key=…,sign-method=…,ttl=…"
    )
    p.add_argument("--auth-token-ttl", default=None, help="simple token TTL in seconds (default 300)")
    p.add_argument("--bcrypt-cost", default=None, help="bcrypt cost for new passwords (default 10)")
    p.add_argument("--max-request-bytes", default=None, help="largest client request (default 1572864)")
    return p


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _secret_file(data_dir: Path) -> Path:
    path = data_dir / "internal-secret"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return path


class Child:
    def __init__(self, role: str, args: list[str]) -> None:
        self.role = role
        self.args = args
        self.proc: asyncio.subprocess.Process | None = None
        self._pump: asyncio.Task[None] | None = None

    async def start(self, ready_prefix: str) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "proxy.cli",
            *self.args,
            stdout=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL,
        )
        assert self.proc.stdout is not None
        deadline = asyncio.get_running_loop().time() + READY_TIMEOUT
        while True:
            left = deadline - asyncio.get_running_loop().time()
            try:
                line = await asyncio.wait_for(self.proc.stdout.readline(), max(left, 0.01))
            except TimeoutError as exc:
                raise RuntimeError(f"{self.role} did not become ready in {READY_TIMEOUT:.0f}s") from exc
            if not line:
                code = await self.proc.wait()
                raise RuntimeError(f"{self.role} exited with code {code} before it was ready")
            sys.stdout.write(line.decode(errors="replace"))
            if line.decode(errors="replace").startswith(ready_prefix):
                break
        sys.stdout.flush()
        self._pump = asyncio.get_running_loop().create_task(self._forward())

    async def _forward(self) -> None:
        assert self.proc and self.proc.stdout
        async for line in self.proc.stdout:
            sys.stdout.write(line.decode(errors="replace"))
            sys.stdout.flush()

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), STOP_TIMEOUT)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()


async def run(a: argparse.Namespace) -> int:
    data_dir = Path(a.data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    secret = _secret_file(data_dir)
    client_url = f"http://127.0.0.1:{a.client_port}"
    internal_port = _free_port()
    store = Child(
        "store",
        [
            "store",
            "--name",
            "local",
            "--data-dir",
            str(data_dir / "node1"),
            "--listen-internal-urls",
            f"http://127.0.0.1:{internal_port}",
            "--internal-secret-file",
            str(secret),
            "--advertise-client-urls",
            client_url,
            "--initial-advertise-peer-urls",
            "http://127.0.0.1:2380",
        ],
    )
    proxy_args = [
        "proxy",
        "--listen-client-urls",
        client_url,
        "--store-endpoints",
        f"127.0.0.1:{internal_port}",
        "--internal-secret-file",
        str(secret),
    ]
    for flag in ("auth_token", "auth_token_ttl", "bcrypt_cost", "max_request_bytes"):
        value = getattr(a, flag)
        if value is not None:
            proxy_args += ["--" + flag.replace("_", "-"), str(value)]
    proxy = Child("proxy", proxy_args)
    children = [store, proxy]
    state_file = data_dir / "local.json"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    code = 0
    try:
        await store.start("raftgate store:")
        await proxy.start("raftgate proxy:")
        state = {
            "client_url": client_url,
            "data_dir": str(data_dir),
            "processes": [
                {
                    "role": "store",
                    "name": "local",
                    "pid": store.proc.pid if store.proc else None,
                    "internal_port": internal_port,
                    "data_dir": str(data_dir / "node1"),
                },
                {"role": "proxy", "pid": proxy.proc.pid if proxy.proc else None, "client_port": a.client_port},
            ],
        }
        tmp = state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(state_file)
        print(f"raftgate local: ready on 127.0.0.1:{a.client_port}", flush=True)
        waits = [asyncio.ensure_future(c.proc.wait()) for c in children if c.proc]
        stopped = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait([stopped, *waits], return_when=asyncio.FIRST_COMPLETED)
        if stopped not in done:
            print("raftgate local: a child process exited; stopping", file=sys.stderr)
            code = 1
        stopped.cancel()
    except RuntimeError as exc:
        print(f"raftgate local: {exc}", file=sys.stderr)
        code = 1
    finally:
        for child in reversed(children):
            await child.stop()
        state_file.unlink(missing_ok=True)
    return code


def main(argv: list[str]) -> int:
    a = _parser().parse_args(argv)
    if not 0 < a.client_port < 65536:
        print("raftgate local: --client-port must be 1-65535", file=sys.stderr)
        return 2
    return asyncio.run(run(a))
