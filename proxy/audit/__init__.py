"""The audit log (``--audit-log``): one JSON object per line for every auditable event.

Why here and this way: the proxy sees every client request (etcd has no audit trail, #21764), so
it is where Vault-style audit records belong. A record names the method, the user the request ran
as, the client address, the result (``"ok"`` or etcd's error message), the keys (base64, as etcd's
JSON gateway writes bytes), the auth revision, the duration and a token's sha256 fingerprint —
never a password, a token or a value: records are built from a closed set of request fields.

Writes never block the event loop: records go into a queue bounded in bytes that one writer
thread drains with plain ``os.write`` calls. At the bound a record is dropped and counted
(``raftgate_proxy_audit_records_dropped_total``); with ``--audit-fail-closed`` a request is
admitted only when the log is writable and its record is sure to fit (room is reserved when the
request arrives), otherwise it is refused with ``Unavailable`` ``raftgate: audit log unavailable``
(Vault's rule: nothing served unaudited). A write that fails is kept and tried again (every
``RETRY_SECONDS``, or at once on SIGHUP, which also reopens the file for logrotate), so a full disk
loses nothing until the queue is full.

Levels (``--audit-level``): ``auth`` — Authenticate and every auth administration call (the Auth
service's methods that are not open to anyone: derived from raftgate/methods.py); ``denials``
(default) — those plus every request answered with an error (a client's own cancellation is not a
refusal); ``all`` — every request. Watch streams are recorded per create and cancel, not per event.

Three modules: the records (records.py: what a line holds, and its bounds), the writer (writer.py:
the bounded queue and its thread), the handler wrappers (handlers.py: each call's record in the
making, and watch creates and cancels).
"""
