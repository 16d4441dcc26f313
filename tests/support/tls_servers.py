"""etcd and raftgate serving TLS with --client-cert-auth, and etcdctl's environment for a client certificate."""

from __future__ import annotations

from pathlib import Path

from tests.support.processes import (
    EtcdServer,
    RaftgateLocal,
    etcdctl,
)


def tls_flags(pki: dict[str, Path]) -> list[str]:
    return [f"--cert-file={pki['server.crt']}", f"--key-file={pki['server.key']}",
            f"--trusted-ca-file={pki['ca']}", "--client-cert-auth"]


def ctl_env(pki: dict[str, Path], cn: str | None) -> dict[str, str]:
    env = {"ETCDCTL_CACERT": str(pki["ca"])}
    if cn is not None:
        env |= {"ETCDCTL_CERT": str(pki[f"{cn}.crt"]), "ETCDCTL_KEY": str(pki[f"{cn}.key"])}
    return env


class TLSEtcd(EtcdServer):
    def __init__(self, workdir: Path, pki: dict[str, Path]) -> None:
        super().__init__(workdir, extra_args=tls_flags(pki))
        self.pki = pki

    def command(self) -> list[str]:
        cmd = super().command()
        http, https = f"http://127.0.0.1:{self.client_port}", self.endpoint
        return [c.replace(http, https) for c in cmd]

    @property
    def endpoint(self) -> str:
        return f"https://127.0.0.1:{self.client_port}"

    def is_ready(self) -> bool:
        rc, _, _ = etcdctl(self.endpoint, "endpoint", "status", timeout=10, dial_timeout="1s",
                           env=ctl_env(self.pki, "root"))
        return rc == 0


class TLSRaftgate(RaftgateLocal):
    def __init__(self, workdir: Path, pki: dict[str, Path]) -> None:
        super().__init__(workdir, extra_args=["--nodes", "1", *tls_flags(pki)])
        self.pki = pki

    @property
    def endpoint(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def is_ready(self) -> bool:
        if not (self._ready.is_set() or self.local_json() is not None):
            return False
        rc, out, _ = etcdctl(self.endpoint, "auth", "status", timeout=10, dial_timeout="1s",
                             env=ctl_env(self.pki, "root"))
        return rc == 0 and out.startswith("Authentication Status:")
