"""The ``raftgate`` console script: ``store``, ``proxy`` and ``local`` subcommands."""

from __future__ import annotations

import sys

USAGE = """usage: raftgate {store,proxy,local,bootstrap-auth} [flags]

  store   run one authstore node (the replicated key-value and auth store)
  proxy   run the authproxy: the etcd v3 API in front of the store
  local   run a store node and a proxy together in the foreground (development)
  bootstrap-auth  create the root user and role and enable authentication, once (Helm hook)

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
    else:
        print(f"raftgate: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
