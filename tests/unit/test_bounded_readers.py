"""Every small file raftgate reads (keys, certificates, CRLs, secrets, identity files, JWKS and user
maps) is read with a bound in bytes: a file of exactly the bound is read, one byte more is refused
with a message that names the file and the bound (a wrong path to a huge file is told, not read)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from proxy import identity_file, tls
from raftgate import config_support, crl, jwt_keys, password_file, workload_identity
from raftgate.bounded_file import FileReadError, read_bounded

# name -> (bound, read the file at the path: raises the module's own error)
READERS: dict[str, tuple[int, Callable[[Path], object]]] = {
    "config file": (100, lambda p: config_support.read_file("--flag", p, 100)),
    "JWT key": (jwt_keys.MAX_KEY_FILE_BYTES, jwt_keys.read_key_file),
    "password file": (password_file.MAX_FILE_BYTES, lambda p: password_file.read_password_file(str(p))),
    "identity file": (identity_file.MAX_FILE_BYTES, lambda p: identity_file.read_credential("jwt", p)),
    "client TLS file": (tls.MAX_PEM_BYTES, lambda p: tls.load(tls.ClientTLS(str(p), str(p)))),
    "CRL": (crl.MAX_CRL_BYTES, lambda p: crl.RevocationList(str(p), [])),
    "workload user map": (workload_identity.MAX_DOCUMENT_BYTES,
                          lambda p: workload_identity.UserMap.from_file(str(p))),
}


@pytest.mark.parametrize("name", READERS)
def test_one_byte_over_the_bound_is_refused_naming_file_and_bound(tmp_path: Path, name: str) -> None:
    bound, read = READERS[name]
    path = tmp_path / "big"
    with open(path, "wb") as f:
        f.truncate(bound + 1)  # sparse: costs no disk
    with pytest.raises(Exception) as e:
        read(path)
    assert str(path) in str(e.value) and f"larger than {bound} bytes" in str(e.value), str(e.value)


@pytest.mark.parametrize("name", READERS)
def test_a_file_of_exactly_the_bound_is_read(tmp_path: Path, name: str) -> None:
    bound, read = READERS[name]
    path = tmp_path / "full"
    path.write_bytes(b"a" * bound)
    try:
        read(path)
    except Exception as e:  # it does not parse: fine, it was read
        assert "larger than" not in str(e) and "too large" not in str(e), str(e)


def test_the_reader_says_why_a_file_cannot_be_read(tmp_path: Path) -> None:
    with pytest.raises(FileReadError, match=r"cannot read '.*missing': No such file"):
        read_bounded(tmp_path / "missing", 10)
    with pytest.raises(FileReadError, match="cannot read .*: Is a directory"):
        read_bounded(tmp_path, 10)
    (tmp_path / "blank").write_bytes(b" \n\t")
    assert read_bounded(tmp_path / "blank", 10) == b" \n\t"
    with pytest.raises(FileReadError, match="'.*blank' is empty"):
        read_bounded(tmp_path / "blank", 10, not_blank=True)
    with pytest.raises(FileReadError, match="larger than 10 bytes"):
        read_bounded("/dev/zero", 10)  # a device that never ends: 11 bytes read, then refused
