"""Reading a password from a file (a mounted Secret), the same way for every program that takes one.

The store reads root's initial password from one (``--initial-root-password-file``) and
``bootstrap-auth`` reads the same Secret, so both must agree byte for byte on what the password
is: the file's UTF-8 text without a trailing newline (as `echo` and editors leave it).
"""

from __future__ import annotations

from raftgate.bounded_file import FileReadError, read_bounded

#: a password file larger than this is a mistake (a wrong path), not a password
MAX_FILE_BYTES = 4096
#: bcrypt uses at most this many bytes of a password
BCRYPT_MAX_BYTES = 72


class PasswordFileError(ValueError):
    """The file is unusable; the message names the file, never its content."""


def read_password_file(path: str) -> str:
    try:
        data = read_bounded(path, MAX_FILE_BYTES)
    except FileReadError as exc:
        raise PasswordFileError(str(exc)) from None
    try:
        password = data.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError:
        raise PasswordFileError(f"{path} is not UTF-8 text") from None
    if not password:
        raise PasswordFileError(f"{path} is empty")
    if len(password.encode("utf-8")) > BCRYPT_MAX_BYTES:
        raise PasswordFileError(f"{path}: the password is longer than bcrypt's {BCRYPT_MAX_BYTES} bytes")
    return password
