"""The committed generated code is exactly what `python -m protos.generate` produces, and the
protos keep etcd's wire contract (field numbers clients depend on)."""

from __future__ import annotations

import filecmp
from pathlib import Path

from protos import generate
from protos.etcdserverpb import raft_internal_pb2, rpc_pb2

ROOT = Path(generate.__file__).resolve().parent.parent


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    generate.generate(tmp_path)
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert fresh, "protoc produced nothing"
    stale = [str(rel) for rel in fresh if not filecmp.cmp(tmp_path / rel, ROOT / rel, shallow=False)]
    assert not stale, f"generated code is stale, run `make protos`: {stale}"
    # sources only: Python's bytecode cache (protos/**/__pycache__/*_pb2.cpython-311.pyc, written
    # by any import where PYTHONDONTWRITEBYTECODE is unset) is neither generated nor committed
    committed = {p.relative_to(ROOT) for p in (ROOT / "protos").rglob("*_pb2*.py*")
                 if p.suffix in (".py", ".pyi") and "__pycache__" not in p.parts}
    assert committed == set(fresh), "generated files without a .proto source (or the reverse)"


def test_etcd_field_numbers() -> None:
    def numbers(msg: type) -> dict[str, int]:
        return {f.name: f.number for f in msg.DESCRIPTOR.fields}

    assert numbers(rpc_pb2.RangeRequest)["max_create_revision"] == 13
    assert numbers(rpc_pb2.Compare)["range_end"] == 64
    assert numbers(rpc_pb2.WatchResponse)["events"] == 11
    assert numbers(rpc_pb2.AuthUserAddRequest) == {"name": 1, "password": 2, "options": 3, "hashedPassword": 4}
    assert numbers(rpc_pb2.AuthUserChangePasswordRequest)["hashedPassword"] == 3
    internal = numbers(raft_internal_pb2.InternalRaftRequest)
    assert (internal["header"], internal["authenticate"], internal["auth_status"]) == (100, 1012, 1013)
    assert internal["auth_role_revoke_permission"] == 1204
    # etcd's three fields, plus raftgate's markers at numbers etcd leaves free
    assert numbers(raft_internal_pb2.RequestHeader) == {"ID": 1, "username": 2, "auth_revision": 3,
                                                        "invalid_token": 1000, "simple_token": 1001}
    services = {s.name for s in rpc_pb2.DESCRIPTOR.services_by_name.values()}
    assert services == {"KV", "Watch", "Lease", "Cluster", "Maintenance", "Auth"}
