"""The auth store, key-range permissions and the one authorization function (etcd 3.7.1 semantics)."""
