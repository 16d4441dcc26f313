"""What both programs share: the ``raftgate`` console script, etcd's error table, the side servers
for metrics and health, and the simple-token format. Imports neither ``proxy`` nor ``authstore``
(``raftgate.cli`` alone starts them, lazily); the contracts in pyproject.toml say so."""
