"""The arguments of one secret-mode store node on given ports (shared by the port and pre-authentication tests)."""

from __future__ import annotations

from pathlib import Path

from tests.support.processes import SECRET


def _store_args(tmp_path: Path, *, internal: int, peer: int, extra: tuple[str, ...] = ()) -> list[str]:
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    return ["store", "--name", "s1", "--data-dir", str(tmp_path / "data"),
            "--listen-internal-urls", f"http://127.0.0.1:{internal}", "--internal-secret-file", str(secret),
            "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}", "--peer-secret-file", str(secret), *extra]
