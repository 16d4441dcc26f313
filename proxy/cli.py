"""The ``raftgate`` console script: one entry point, a subcommand per program."""

from __future__ import annotations

import sys

USAGE = """usage: raftgate {store,proxy,local,bootstrap-auth,bench} [flags]

  store           run one authstore node (the replicated key-value and auth store)
  proxy           run the authproxy: the etcd v3 API in front of the store
  local           run 1, 3 or 5 store nodes and a proxy in the foreground (development)
  bootstrap-auth  create the root user and role and enable authentication, once (Helm hook)
  bench           measure raftgate and a real etcd side by side on the same load

Run `raftgate <command> --help` for the flags of each."""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "store":
        from authstore.main import main as run
    elif command == "proxy":
        from proxy.main import main as run
    elif command == "local":
        from proxy.local import main as run
    elif command == "bootstrap-auth":
        from proxy.bootstrap import main as run
    elif command == "bench":
        from bench.cli import main as run
    else:
        print(f"raftgate: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
