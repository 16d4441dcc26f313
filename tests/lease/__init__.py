"""Lease tests: etcdctl and python-etcd3 against raftgate (and etcd 3.5.1 where they agree)."""
