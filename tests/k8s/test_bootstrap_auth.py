"""`raftgate bootstrap-auth` (the Helm hook Job's command) against a running `raftgate local`:
waits for the endpoint, creates root, enables auth, is idempotent, never prints the password."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from proxy import bootstrap
from tests.support.processes import REPO_ROOT, RaftgateLocal, free_port

PASSWORD = "hook-Pa55word"


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raftgate.cli", "bootstrap-auth", *args],
        capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT,
    )  # fmt: skip


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "root-password"
    path.write_text(PASSWORD + "\n")  # as `echo` or an editor would leave it
    return path


@pytest.fixture
def server(tmp_path: Path):
    s = RaftgateLocal(tmp_path / "rg", bcrypt_cost=4)
    yield s
    s.stop()


def test_waits_for_the_endpoint_then_enables_auth_once(server: RaftgateLocal, password_file: Path) -> None:
    # Start the bootstrap before the server: it must wait (polling) until the endpoint answers.
    waiting = subprocess.Popen(
        [sys.executable, "-m", "raftgate.cli", "bootstrap-auth", "--endpoints", server.target,
         "--root-password-file", str(password_file), "--timeout", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
    )  # fmt: skip
    try:
        server.start()
        out, err = waiting.communicate(timeout=60)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.communicate()
    assert waiting.returncode == 0, err
    assert "authentication enabled" in out
    assert PASSWORD not in out + err

    rc, out, _ = server.ctl("auth", "status")
    assert rc == 0 and "Authentication Status: true" in out
    rc, out, err = server.ctl("user", "get", "root", user=f"root:{PASSWORD}")
    assert rc == 0, err
    assert "Roles: root" in out

    again = run("--endpoints", server.target, "--root-password-file", str(password_file), "--timeout", "20")
    assert again.returncode == 0, again.stderr
    assert "already enabled" in again.stdout
    assert PASSWORD not in again.stdout + again.stderr


def test_refuses_a_root_someone_else_created(server: RaftgateLocal, password_file: Path) -> None:
    """Auth off (a cluster started without --initial-root-password-file): a squatter made root first.
    Trust item 2: the bootstrap must not adopt it quietly - it fails, saying why."""
    server.start()
    rc, _, err = server.ctl("user", "add", "root:other-password")
    assert rc == 0, err
    rc, _, err = server.ctl("role", "add", "root")
    assert rc == 0, err
    done = run("--endpoints", f"http://{server.target}", "--root-password-file", str(password_file))
    assert done.returncode == 1
    assert "root does not authenticate with the password in the file" in done.stderr
    assert PASSWORD not in done.stdout + done.stderr


def test_refuses_when_another_user_holds_role_root(server: RaftgateLocal, password_file: Path) -> None:
    server.start()
    for args in (["user", "add", "mallory:x"], ["role", "add", "root"], ["user", "grant-role", "mallory", "root"]):
        rc, _, err = server.ctl(*args)
        assert rc == 0, err
    done = run("--endpoints", server.target, "--root-password-file", str(password_file))
    assert done.returncode == 1
    assert "user mallory holds role root" in done.stderr


def test_gives_up_after_the_timeout_when_nothing_answers(password_file: Path) -> None:
    started = time.monotonic()
    done = run(
        "--endpoints", f"127.0.0.1:{free_port()}", "--root-password-file", str(password_file), "--timeout", "1.5"
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 1
    assert "gave up after 1.5s" in done.stderr and "UNAVAILABLE" in done.stderr
    assert elapsed < 15


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "the following arguments are required"),
        (["--endpoints", "nohostport"], "is not host:port"),
        (["--endpoints", "https://h:2379"], "TLS client endpoints are not supported"),
        (["--endpoints", "h:1", "--timeout", "0"], "must be positive"),
        (["--endpoints", "h:1", "--root-password-file", "/nonexistent/pw"], "cannot read '/nonexistent/pw'"),
    ],
)
def test_bad_flags_exit_2(args: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    if "--root-password-file" not in args and args:
        pw = tmp_path / "pw"
        pw.write_text("x")
        args = [*args, "--root-password-file", str(pw)]
    assert bootstrap.main(args) == 2
    assert message in capsys.readouterr().err


def test_empty_password_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pw = tmp_path / "pw"
    pw.write_text("\n")
    assert bootstrap.main(["--endpoints", "h:1", "--root-password-file", str(pw)]) == 2
    assert "is empty" in capsys.readouterr().err


def test_cli_dispatches_bootstrap_auth() -> None:
    done = run("--help")
    assert done.returncode == 0 and "--root-password-file" in done.stdout
