"""Sidecar identity mode: the identity files (formats, reload on change), the lending policy, the
token lifecycle (one login for many requests, refresh after a refusal, backoff), and its flags."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from protos.etcdserverpb import rpc_pb2 as pb
from proxy.config import ConfigError, load
from proxy.identity_file import (
    MAX_FILE_BYTES,
    IdentityFileError,
    IdentityFiles,
    JwtCredential,
    PasswordCredential,
    read_credential,
)
from proxy.sidecar import Sidecar, is_local_listener, is_local_peer
from raftgate.errors import Err, EtcdError

# --- file formats ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "want"),
    [
        ("alice\nsecret\n", ("alice", "secret")),
        ("alice\nsecret", ("alice", "secret")),
        ("alice\r\nsecret\r\n", ("alice", "secret")),
        ("alice\n  spaced pw \n\n", ("alice", "  spaced pw ")),
        ("älice\npässword\n", ("älice", "pässword")),
    ],
)
def test_two_line_file(tmp_path: Path, content: str, want: tuple[str, str]) -> None:
    path = tmp_path / "id"
    path.write_text(content, encoding="utf-8")
    assert read_credential("password", path) == PasswordCredential(*want)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("alice\n", "no password"),
        ("alice", "two lines"),
        ("alice\nsecret\nextra\n", "two lines"),
        ("\nsecret\n", "no user name"),
        ("alice\n\n", "no password"),
        ("", "two lines"),
    ],
)
def test_bad_two_line_file(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "id"
    path.write_text(content)
    with pytest.raises(IdentityFileError, match=problem) as err:
        read_credential("password", path)
    assert "secret" not in str(err.value)


def _secret_volume(root: Path, version: str, files: dict[str, str]) -> None:
    """Lays files out as kubelet mounts a Secret: ..<version>/, a ..data link, per-key links."""
    root.mkdir(exist_ok=True)
    data = root / f"..{version}"
    data.mkdir()
    for name, text in files.items():
        (data / name).write_text(text)
    tmp = root / "..data_tmp"
    tmp.symlink_to(data.name)
    os.replace(tmp, root / "..data")  # the atomic swap kubelet does
    for name in files:
        link = root / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")


def test_secret_volume_directory(tmp_path: Path) -> None:
    vol = tmp_path / "vol"
    _secret_volume(vol, "v1", {"username": "alice", "password": "secret\n"})
    assert read_credential("password", vol) == PasswordCredential("alice", "secret")


def test_missing_or_odd_files(tmp_path: Path) -> None:
    with pytest.raises(IdentityFileError, match="cannot read"):
        read_credential("password", tmp_path / "nope")
    (tmp_path / "username").write_text("alice")
    with pytest.raises(IdentityFileError, match="password"):
        read_credential("password", tmp_path)  # a directory without the password file
    big = tmp_path / "big"
    big.write_bytes(b"a\n" + b"b" * MAX_FILE_BYTES)
    with pytest.raises(IdentityFileError, match="larger"):
        read_credential("password", big)
    latin = tmp_path / "latin"
    latin.write_bytes(b"alice\np\xe4ss\n")
    with pytest.raises(IdentityFileError, match="UTF-8"):
        read_credential("password", latin)


def test_jwt_file_and_directory(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("  aaa.bbb.ccc\n")
    assert read_credential("jwt", tmp_path / "token") == JwtCredential("aaa.bbb.ccc")
    assert read_credential("jwt", tmp_path) == JwtCredential("aaa.bbb.ccc")
    (tmp_path / "two").write_text("aaa.bbb.ccc ddd\n")
    with pytest.raises(IdentityFileError, match="one token"):
        read_credential("jwt", tmp_path / "two")


def test_credentials_never_show_secrets_in_repr() -> None:
    assert "hunter2" not in repr(PasswordCredential("alice", "hunter2"))
    assert "aaa.bbb" not in repr(JwtCredential("aaa.bbb.ccc"))


# --- reload ---------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_reload_after_a_symlink_swap_at_most_once_per_interval(tmp_path: Path) -> None:
    vol = tmp_path / "vol"
    _secret_volume(vol, "v1", {"username": "alice", "password": "one"})
    clock = Clock()
    files = IdentityFiles("password", vol, poll_interval=1.0, clock=clock)
    assert files.current == PasswordCredential("alice", "one") and files.version == 0
    _secret_volume(vol, "v2", {"username": "alice", "password": "two"})
    assert not files.poll()  # within the interval: not even looked at
    clock.now += 1.0
    assert files.poll()
    assert files.current == PasswordCredential("alice", "two") and files.version == 1
    clock.now += 1.0
    assert not files.poll()  # unchanged


def test_rewrite_in_place_and_touch(tmp_path: Path) -> None:
    path = tmp_path / "id"
    path.write_text("alice\none\n")
    files = IdentityFiles("password", path, poll_interval=1.0, clock=Clock())
    os.utime(path, ns=(1, 1))
    assert not files.poll(force=True)  # metadata changed, content did not
    path.write_text("bob\nthree\n")
    os.utime(path, ns=(2, 2))
    assert files.poll(force=True)
    assert files.current == PasswordCredential("bob", "three")


def test_a_bad_update_keeps_the_last_good_credential(tmp_path: Path) -> None:
    path = tmp_path / "id"
    path.write_text("alice\none\n")
    files = IdentityFiles("password", path, clock=Clock())
    path.write_text("alice\n")  # half-written
    os.utime(path, ns=(5, 5))
    assert not files.poll(force=True)
    assert files.current == PasswordCredential("alice", "one")
    path.unlink()
    assert not files.poll(force=True)
    path.write_text("alice\nfixed\n")
    assert files.poll(force=True)
    assert files.current == PasswordCredential("alice", "fixed")


def test_a_bad_file_is_a_start_up_error(tmp_path: Path) -> None:
    with pytest.raises(IdentityFileError):
        IdentityFiles("password", tmp_path / "missing")


# --- lending policy -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("peer", "local"),
    [
        ("ipv4:127.0.0.1:5000", True),
        ("ipv4:127.8.9.10:5000", True),
        ("ipv6:[::1]:5000", True),
        ("ipv6:%5B::1%5D:5000", True),
        ("ipv6:[::ffff:127.0.0.1]:5000", True),
        ("unix:", True),
        ("unix:/run/raftgate.sock", True),
        ("ipv4:10.0.0.7:5000", False),
        ("ipv6:[fe80::1]:5000", False),
        ("ipv6:[::ffff:10.0.0.1]:5000", False),
        ("unix-abstract:x", False),
        ("", False),
        ("garbage", False),
    ],
)
def test_local_peers(peer: str, local: bool) -> None:
    assert is_local_peer(peer) is local


@pytest.mark.parametrize(
    ("address", "local"),
    [
        ("127.0.0.1:2379", True),
        ("[::1]:2379", True),
        ("localhost:2379", True),
        ("unix:/run/etcd.sock", True),
        ("0.0.0.0:2379", False),
        ("[::]:2379", False),
        ("10.1.2.3:2379", False),
        ("etcd.example:2379", False),
    ],
)
def test_local_listeners(address: str, local: bool) -> None:
    assert is_local_listener(address) is local


# --- token lifecycle ------------------------------------------------------------------------------


class FakeAuthenticator:
    """Authenticate as the store would answer it: tokens t1, t2, ... or an etcd error."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.error: Err | None = None
        self.gate: asyncio.Event | None = None

    async def authenticate(self, request: pb.AuthenticateRequest, timeout: float | None = None) -> bytes:
        self.calls.append((request.name, request.password))
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise EtcdError(self.error)
        return pb.AuthenticateResponse(token=f"t{len(self.calls)}").SerializeToString()


def _sidecar(tmp_path: Path, content: str = "alice\none\n") -> tuple[Sidecar, FakeAuthenticator, Path, Clock]:
    path = tmp_path / "id"
    path.write_text(content)
    clock = Clock()
    files = IdentityFiles("password", path, poll_interval=1.0, clock=clock)
    auth = FakeAuthenticator()
    return Sidecar(files, auth, None, clock=clock), auth, path, clock  # type: ignore[arg-type]


def _rewrite(path: Path, content: str, clock: Clock) -> None:
    path.write_text(content)
    os.utime(path, ns=(int(clock.now * 1e9), int(clock.now * 1e9)))
    clock.now += 1.0


def test_one_login_for_many_concurrent_requests(tmp_path: Path) -> None:
    sidecar, auth, _, _ = _sidecar(tmp_path)

    async def go() -> list[Any]:
        auth.gate = asyncio.Event()
        waiting = [asyncio.ensure_future(sidecar.token()) for _ in range(20)]
        await asyncio.sleep(0)
        auth.gate.set()
        return await asyncio.gather(*waiting)

    assert asyncio.run(go()) == ["t1"] * 20
    assert auth.calls == [("alice", "one")]


def test_refresh_after_refusal_is_shared_and_keeps_the_newer_token(tmp_path: Path) -> None:
    sidecar, auth, _, _ = _sidecar(tmp_path)

    async def go() -> tuple[Any, ...]:
        first = await sidecar.token()
        a = await sidecar.refresh(first, "old_revision")
        b = await sidecar.refresh(first, "old_revision")  # a second request refused with t1
        return first, a, b, await sidecar.token()

    assert asyncio.run(go()) == ("t1", "t2", "t2", "t2")
    assert len(auth.calls) == 2


def test_password_change_is_used_at_the_next_login_user_change_at_once(tmp_path: Path) -> None:
    sidecar, auth, path, clock = _sidecar(tmp_path)

    async def go() -> list[Any]:
        seen = [await sidecar.token()]
        _rewrite(path, "alice\ntwo\n", clock)
        seen.append(await sidecar.token())  # the token still works: keep it
        seen.append(await sidecar.refresh(seen[-1], "invalid_token"))
        _rewrite(path, "bob\nthree\n", clock)
        seen.append(await sidecar.token())  # another user: log in as bob now
        return seen

    assert asyncio.run(go()) == ["t1", "t1", "t2", "t3"]
    assert auth.calls == [("alice", "one"), ("alice", "two"), ("bob", "three")]


def test_failed_login_backs_off_until_the_files_change(tmp_path: Path) -> None:
    sidecar, auth, path, clock = _sidecar(tmp_path)
    auth.error = Err.AUTH_FAILED

    async def go() -> str | None:
        for _ in range(3):
            with pytest.raises(EtcdError) as err:
                await sidecar.token()
            assert err.value.err is Err.AUTH_FAILED
        assert len(auth.calls) == 1  # one bcrypt check, not three
        auth.error = None
        _rewrite(path, "alice\nfixed\n", clock)
        return await sidecar.token()

    assert asyncio.run(go()) == "t2"
    assert auth.calls[-1] == ("alice", "fixed")


def test_auth_disabled_lends_nothing_until_a_user_is_needed(tmp_path: Path) -> None:
    sidecar, auth, _, _ = _sidecar(tmp_path)
    auth.error = Err.AUTH_NOT_ENABLED

    async def go() -> list[Any]:
        seen = [await sidecar.token(), await sidecar.token()]
        auth.error = None
        seen.append(await sidecar.refresh(None, "user_empty"))  # auth was enabled meanwhile
        return seen

    assert asyncio.run(go()) == [None, None, "t2"]
    assert len(auth.calls) == 2


def test_jwt_renewed_before_it_expires(tmp_path: Path) -> None:
    path = tmp_path / "id"
    path.write_text("alice\none\n")
    clock = Clock()

    class Jwt:
        ttl_seconds = 100.0

    auth = FakeAuthenticator()
    sidecar = Sidecar(IdentityFiles("password", path, clock=clock), auth, Jwt(), clock=clock)  # type: ignore[arg-type]

    async def go() -> list[Any]:
        seen = [await sidecar.token()]
        clock.now += 80
        seen.append(await sidecar.token())
        clock.now += 15  # 95 s of 100: renew
        seen.append(await sidecar.token())
        return seen

    assert asyncio.run(go()) == ["t1", "t1", "t2"]


def test_jwt_file_identity_switches_when_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("a.b.c\n")
    clock = Clock()
    sidecar = Sidecar(IdentityFiles("jwt", path, clock=clock), None, None, clock=clock)

    async def go() -> list[Any]:
        seen = [await sidecar.token()]
        _rewrite(path, "d.e.f\n", clock)
        seen.append(await sidecar.token())
        seen.append(await sidecar.refresh("d.e.f", "old_revision"))  # nothing newer: the same token
        return seen

    assert asyncio.run(go()) == ["a.b.c", "d.e.f", "d.e.f"]


# --- flags ----------------------------------------------------------------------------------------


@pytest.fixture
def base(tmp_path: Path) -> list[str]:
    secret = tmp_path / "secret"
    secret.write_text("dev-secret\n")
    ident = tmp_path / "id"
    ident.write_text("alice\npw\n")
    return ["--store-endpoints=127.0.0.1:7000", f"--internal-secret-file={secret}"]


def test_identity_flags(base: list[str], tmp_path: Path) -> None:
    ident = str(tmp_path / "id")
    cfg = load([*base, f"--identity-file={ident}"], env={})
    assert cfg.identity is not None and (cfg.identity.kind, cfg.identity.path) == ("password", ident)
    assert load(base, env={}).identity is None
    env_cfg = load(base, env={"RAFTGATE_PROXY_IDENTITY_FILE": ident})
    assert env_cfg.identity == cfg.identity


@pytest.mark.parametrize(
    ("more", "problem"),
    [
        (["--identity-file={id}", "--identity-jwt-file={id}"], "mutually exclusive"),
        (["--identity-file={id}", "--listen-client-urls=http://0.0.0.0:2379"], "loopback or unix"),
        (["--identity-file={dir}/missing"], "cannot read"),
        (["--identity-jwt-file={id}"], "needs --auth-token jwt"),
        (["--identity-file={id}", "--auth-token="], "cannot issue tokens"),
    ],
)
def test_identity_flag_errors(base: list[str], tmp_path: Path, more: list[str], problem: str) -> None:
    args = [m.format(id=tmp_path / "id", dir=tmp_path) for m in more]
    with pytest.raises(ConfigError, match=problem) as err:
        load([*base, *args], env={})
    assert "pw" not in str(err.value).replace(str(tmp_path), "")
