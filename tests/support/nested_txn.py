"""Runs a state-machine call the way the apply stage runs one entry, for unit tests."""

from __future__ import annotations

from typing import Any

import lmdb

from raftgate.errors import EtcdError


def apply_in_nested_txn(env: lmdb.Environment, obj: Any, method: str, *args: Any) -> Any:
    """``obj.method(txn, *args)`` in a write txn nested in a batch's, as apply runs an entry: a
    refusal (EtcdError) aborts the nested txn, so a refused request must leave nothing behind."""
    with env.begin(write=True) as batch:
        txn = env.begin(write=True, parent=batch)
        try:
            resp = getattr(obj, method)(txn, *args)
        except EtcdError:
            txn.abort()
            raise
        txn.commit()
        return resp
