"""The ``raftgate`` console script: one entry point, a subcommand per program.

It lives beside both programs, not inside either, and imports each only when its subcommand runs;
``raftgate local`` (raftgate/local.py) launches both as processes and imports neither: the programs'
config parsers it checks its children's values with are handed to it from here."""

from __future__ import annotations

import os
import signal
import sys

from raftgate import grpc_io

USAGE = """usage: raftgate {store,proxy,local,bootstrap-auth,snapshot,bench} [flags]

  store           run one authstore node (the replicated key-value and auth store)
  proxy           run the authproxy: the etcd v3 API in front of the store
  local           run 1, 3 or 5 store nodes and a proxy in the foreground (development)
  bootstrap-auth  create the root user and role and enable authentication, once (Helm hook)
  snapshot        status and restore of a snapshot file (`etcdctl snapshot save` of raftgate)
  bench           measure raftgate and a real etcd side by side on the same load

Run `raftgate <command> --help` for the flags of each. Documentation: README.md, and the
pages in docs/ (docs/README.md lists them)."""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if args else 2
    # Until a program sets up its own graceful stop, SIGTERM and SIGINT (Ctrl-C) end it quietly
    # with the shell's code for the signal, not with a traceback or a bare -15.
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGINT, _interrupted)
    try:
        return _run(args[0], args[1:])
    except _Interrupted as exc:
        return 128 + exc.signum


class _Interrupted(KeyboardInterrupt):
    """A stop signal that arrived while the program was starting (asyncio lets it propagate)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _interrupted(signum: int, _frame: object) -> None:
    raise _Interrupted(signum)


def _run(command: str, rest: list[str]) -> int:
    if command in ("store", "proxy", "local"):
        # before gRPC is imported: the programs' sockets are read and written on gRPC's poller
        # thread (raftgate/grpc_io.py); local's children inherit it
        grpc_io.apply(os.environ)
    if command == "store":
        from authstore.main import main as run
    elif command == "proxy":
        from proxy.main import main as run
    elif command == "local":
        from authstore.config import parse as check_store
        from proxy.config import load as check_proxy
        from raftgate.local import main as local

        # local launches both programs as processes and imports neither: it checks each child's
        # values with that program's own parser, given here
        return local(rest, check_store, check_proxy)
    elif command == "bootstrap-auth":
        from proxy.bootstrap import main as run
    elif command == "snapshot":
        from authstore.snapshot_tool import main as run
    elif command == "bench":
        from bench.cli import main as run
    else:
        print(f"raftgate: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
