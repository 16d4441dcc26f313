"""etcd's on-disk formats, read and written without Go: the bbolt database file (``bbolt``) that
etcd keeps its backend in and that ``etcdctl snapshot save`` writes (followed by a sha256)."""
