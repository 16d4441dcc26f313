"""Lease authorization details pinned to etcd 3.7.1 (server/etcdserver/apply/auth.go, v3_server.go).

A review asked whether a root caller with a stale auth revision should be refused on a lease with
keys, as etcd 3.5's ``checkLeasePuts`` did (``IsPutPermitted`` per attached key, whose revision
check comes before the root bypass). etcd 3.6.0 added an early return for admins to
``checkLeasePutsKeys`` ("Early exit auth check on lease puts"), and 3.7.1's ``checkLeaseRenew``,
``checkLeaseTimeToLive`` and ``checkLeaseLeases`` also return for an admin before any key or
revision check. raftgate follows 3.7.1: root passes the lease-key checks whatever its revision;
a Put still fails on its own key check first.
"""

from __future__ import annotations

from protos.etcdserverpb import raft_internal_pb2 as ipb
from protos.etcdserverpb import rpc_pb2 as pb
from raftgate.errors import Err
from tests.support.authorize_world import World, put, w  # noqa: F401 - w is the fixture


def test_root_with_a_stale_revision_passes_lease_key_checks_as_in_3_7_1(w: World) -> None:  # noqa: F811
    stale = w.rev - 1
    assert w.check("lease_revoke", pb.LeaseRevokeRequest(ID=2), "root", rev=stale) is None
    assert w.check("lease_keep_alive", pb.LeaseKeepAliveRequest(ID=2), "root", rev=stale) is None
    assert w.check("lease_time_to_live", pb.LeaseTimeToLiveRequest(ID=4, keys=True), "root", rev=stale) is None
    assert w.check("lease_leases", pb.LeaseLeasesRequest(), "root", rev=stale) is None
    # Put checks its own key first (isOpPermitted: revision before the root bypass)
    assert w.check("put", put(b"w1", lease=2), "root", rev=stale) is Err.AUTH_OLD_REVISION
    # a non-root caller with a stale revision is refused on the first attached key
    assert w.check("lease_revoke", pb.LeaseRevokeRequest(ID=1), rev=stale) is Err.AUTH_OLD_REVISION


def test_store_lease_entries_carry_no_identity(w: World) -> None:  # noqa: F811
    for user in ("", "nobody", "alice"):
        assert w.check("lease_renew", ipb.LeaseRenewEntry(ID=2), user) is None
        assert w.check("lease_expire", ipb.LeaseExpireEntry(ID=2, deadline_ms=1), user) is None
