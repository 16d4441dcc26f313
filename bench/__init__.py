"""Side-by-side benchmarks of raftgate against a real etcd 3.5.1 (``python -m bench``)."""
