"""authproxy: serves the etcd v3 API, checks passwords and tokens, and forwards stamped requests to the store."""
