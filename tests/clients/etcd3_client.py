"""python-etcd3 0.12 against an auth-enabled server; prints one JSON object of observations.

Run as a SUBPROCESS only (etcd3 ships its own copies of etcd's protos, which would clash with
raftgate's in one process) with PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python.

Usage: etcd3_client.py HOST:PORT
Expects the upstream fixture (root/rootpw; test-user/pass with READWRITE on `foo`) plus READWRITE on
the prefix `/cli/` for test-user.

etcd3 0.12 turns user/password into gRPC call credentials, which current grpcio refuses on a plaintext
channel; so we authenticate with the client's own Auth stub and hand the token to the client as the
`token` metadata it already sends on every call.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import etcd3
import grpc
from etcd3 import etcdrpc, watch


class TokenClient(etcd3.Etcd3Client):
    """Etcd3Client that authenticates through its Auth stub and sends the token as metadata."""

    def login(self, user: str, password: str) -> str:
        resp = etcdrpc.AuthStub(self.channel).Authenticate(
            etcdrpc.AuthenticateRequest(name=user, password=password), timeout=10
        )
        self.use_token(resp.token)
        return resp.token

    def use_token(self, token: str | None) -> None:
        self.metadata = (("token", token),) if token else None
        self.watcher = watch.Watcher(
            etcdrpc.WatchStub(self.channel), timeout=self.timeout, call_credentials=None, metadata=self.metadata
        )


def rpc_error(exc: BaseException) -> dict[str, Any]:
    """The gRPC code and details behind an exception (etcd3 wraps some codes in its own classes)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, grpc.RpcError) and hasattr(seen, "code"):
            return {"code": seen.code().name, "details": seen.details()}
        seen = seen.__context__ or seen.__cause__
    return {"code": type(exc).__name__, "details": str(exc)}


def attempt(fn: Any) -> dict[str, Any]:
    try:
        return {"ok": fn()}
    except Exception as exc:  # noqa: BLE001 - every outcome is data for the asserting test
        return {"error": rpc_error(exc)}


def main() -> None:
    host, port = sys.argv[1].rsplit(":", 1)
    results: dict[str, Any] = {}
    anon = TokenClient(host=host, port=int(port), timeout=10)
    results["anon_get"] = attempt(lambda: anon.get("foo")[0])
    results["anon_put"] = attempt(lambda: anon.put("foo", "x") and None)
    results["bad_password"] = attempt(lambda: anon.login("test-user", "wrong") and None)
    results["unknown_user"] = attempt(lambda: anon.login("nobody", "pass") and None)
    anon.use_token("bogus.token")
    results["bogus_token_get"] = attempt(lambda: anon.get("foo")[0])
    anon.close()

    c = TokenClient(host=host, port=int(port), timeout=10)
    results["login"] = attempt(lambda: bool(c.login("test-user", "pass")))
    results["put_a"] = attempt(lambda: c.put("/cli/e3/a", "1") and None)
    results["put_b"] = attempt(lambda: c.put("/cli/e3/b", "2") and None)
    results["get_a"] = attempt(lambda: c.get("/cli/e3/a")[0].decode())
    results["get_missing"] = attempt(lambda: c.get("/cli/e3/missing")[0])
    results["get_prefix"] = attempt(lambda: [(m.key.decode(), v.decode()) for v, m in c.get_prefix("/cli/e3/")])
    results["put_denied"] = attempt(lambda: c.put("hoo", "x") and None)
    results["get_denied"] = attempt(lambda: c.get("hoo")[0])
    results["prefix_denied"] = attempt(lambda: list(c.get_prefix("/cl")))
    t = c.transactions
    results["txn_success"] = attempt(
        lambda: c.transaction(
            compare=[t.value("/cli/e3/a") == "1"], success=[c.transactions.put("/cli/e3/c", "3")], failure=[]
        )[0]
    )
    results["txn_failure_branch"] = attempt(
        lambda: c.transaction(
            compare=[t.value("/cli/e3/a") == "nope"],
            success=[],
            failure=[c.transactions.get("/cli/e3/c")],
        )[0]
    )
    results["txn_denied_compare"] = attempt(
        lambda: c.transaction(compare=[t.value("hoo") == "1"], success=[], failure=[])[0]
    )
    results["txn_denied_unused_branch"] = attempt(
        lambda: c.transaction(
            compare=[t.value("/cli/e3/a") == "1"],
            success=[c.transactions.put("/cli/e3/d", "4")],
            failure=[c.transactions.delete("hoo")],
        )[0]
    )
    results["get_c"] = attempt(lambda: c.get("/cli/e3/c")[0].decode())
    results["get_d"] = attempt(lambda: c.get("/cli/e3/d")[0])
    results["delete_b"] = attempt(lambda: c.delete("/cli/e3/b"))
    results["delete_denied"] = attempt(lambda: c.delete("hoo"))
    c.close()

    root = TokenClient(host=host, port=int(port), timeout=10)
    root.login("root", "rootpw")
    results["root_put"] = attempt(lambda: root.put("hoo", "root") and None)
    results["root_get"] = attempt(lambda: root.get("hoo")[0].decode())
    results["root_status_version"] = attempt(lambda: bool(root.status().version))
    root.close()
    print(json.dumps(results, sort_keys=True))


if __name__ == "__main__":
    main()
