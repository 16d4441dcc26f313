"""Owner-only files and directories for data and secrets (etcd's fileutil.PrivateDirMode/PrivateFileMode).

A store's data dir holds every key, value and bcrypt hash; `raftgate local`'s also holds the
internal secret. Another local user must read none of it, whatever umask the process inherited:

* processes that write only data (the store, ``raftgate snapshot restore``) narrow their umask to
  ``077`` at start (``restrict_umask``), so every file and directory they or a library (LMDB,
  ``tempfile``) create is owner-only, including ones added later; where a mode is given
  explicitly it is ``PRIVATE_FILE_MODE`` / ``PRIVATE_DIR_MODE``, which a umask can only narrow;
* a data dir that already exists with a wider mode is left as it is (on Kubernetes the volume's
  mode may be the kubelet's, with a group for ``fsGroup``) and named in one warning at start,
  as etcd's ``CheckDirPermission`` warns.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
PRIVATE_UMASK = 0o077


def restrict_umask() -> int:
    """Makes everything this process creates from now on owner-only; returns the old umask."""
    return os.umask(PRIVATE_UMASK)


def private_dir(path: Path) -> bool:
    """Creates `path` (and missing parents) 0700 unless it exists; True if it existed."""
    if path.is_dir():
        return True
    try:
        path.mkdir(mode=PRIVATE_DIR_MODE, parents=True)
    except FileExistsError:
        return True
    return False


def wider_than_private(path: Path) -> str | None:
    """etcd's warning, when the existing directory `path` lets others in; None if it does not."""
    mode = path.stat().st_mode
    if not stat.S_ISDIR(mode) or not mode & (stat.S_IRWXG | stat.S_IRWXO):
        return None
    return (f"check file permission: data dir {str(path)!r} exists, but its permission is "
            f"{stat.filemode(mode)!r}; the recommended permission is 'drwx------' (chmod 700) to prevent "
            "unprivileged access to the data (raftgate leaves it as it is)")


def fsync_dir(path: Path) -> None:
    """Makes the names in directory `path` durable (a file created or renamed there)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_private(path: Path, data: bytes) -> None:
    """Writes `path` whole (a staged file renamed over it, synced with its directory), 0600
    whatever the umask."""
    staged = path.with_name(path.name + ".tmp")
    staged.unlink(missing_ok=True)  # a leftover (perhaps wider) from a crash is never reused
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(staged, path)
    fsync_dir(path.parent)
