"""A rotation that leaves the client TLS files unusable (a key that does not match, a file the
proxy cannot read) keeps the current certificate, as it should; but grpc-core asks
``ServerTLS.fetch`` before every handshake, so anyone who can open connections made the proxy
read and parse the files again and log a warning per connection (CPU and log volume driven by
an unauthenticated client) for as long as the files stay broken. Once per broken state is enough:
the files are tried again when they change again."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from proxy.tls import ClientTLS, ServerTLS, load
from tests.support.processes import write_test_pki


def test_a_broken_rotation_is_tried_and_logged_once_until_the_files_change(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    old = write_test_pki(tmp_path / "old", ["alice"])
    new = write_test_pki(tmp_path / "new", ["alice"], ca_name="rotated-ca")
    crt, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(old["server.crt"], crt)
    shutil.copy(old["server.key"], key)
    loads = [0]

    def counting(spec: ClientTLS):  # type: ignore[no-untyped-def]
        loads[0] += 1
        return load(spec)

    tls = ServerTLS(ClientTLS(str(crt), str(key)), loader=counting)
    shutil.copy(new["server.crt"], crt)  # half a rotation: the key does not match
    with caplog.at_level(logging.WARNING, logger="proxy.tls"):
        for _ in range(50):  # fifty handshakes
            assert tls.fetch() is None
    assert loads[0] == 1 + 1  # start-up, then the broken files once
    assert len([r for r in caplog.records if "cannot be used yet" in r.getMessage()]) == 1
    shutil.copy(new["server.key"], key)  # the rotation completes
    assert tls.fetch() is not None and tls.reloads == 1
