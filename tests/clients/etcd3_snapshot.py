"""python-etcd3 0.12's ``snapshot()`` as root into a file (the client suites' snapshot test).

Run as a SUBPROCESS only (etcd3 ships its own copies of etcd's protos) with
PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python. Usage: etcd3_snapshot.py HOST:PORT PASSWORD FILE
"""

from __future__ import annotations

import sys

from etcd3_client import TokenClient


def main() -> None:
    target, password, path = sys.argv[1:4]
    host, port = target.rsplit(":", 1)
    client = TokenClient(host=host, port=int(port), timeout=60)
    client.login("root", password)
    with open(path, "wb") as f:
        client.snapshot(f)


if __name__ == "__main__":
    main()
