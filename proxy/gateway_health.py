"""etcd's ``/health`` on the gateway port, as etcd 3.5 serves it on its client URL (etcdhttp/metrics.go).

Kubernetes probes point at it, so it needs no token. ``GET /health`` answers 200
``{"health":"true","reason":""}``, or 503 with the reason (``RAFT NO LEADER``, ``ALARM NOSPACE``,
``RANGE ERROR:<etcd's error>``) when the store could not serve: the node this proxy stands for
(a member proxy's own node) must have no alarm and follow a leader, which it tells the proxy over
the internal API (no user: etcd reads its own alarm list, and raftgate's Alarm GET needs a user
with auth on), and a one-key read without a token must be answered, where etcd's "user name is
empty" and "permission denied" count as answered, as in etcd.
``?serializable=true`` skips the leader check and reads serializably (a liveness probe of this
member); ``?exclude=NOSPACE`` (repeatable) ignores that alarm. Other methods: 405 with ``Allow: GET``.
etcd 3.5.1 serves no ``/readyz`` or ``/livez`` (those came with 3.6): they are 404 here too.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Protocol

import grpc
from aiohttp import web

from protos.etcdserverpb import rpc_pb2
from proxy import metrics
from proxy.pipeline import Pipeline
from raftgate.methods import METHODS, Method

log = logging.getLogger(__name__)

#: etcd's request timeout with its default election timeout (5 s + 2 x 1 s): the read's bound
CHECK_TIMEOUT = 7.0
#: the errors etcd's checkV3Health counts as a served read (auth.ErrUserEmpty, auth.ErrPermissionDenied)
SERVED = ("etcdserver: user name is empty", "etcdserver: permission denied")
_ALARMS = {rpc_pb2.AlarmType.NOSPACE: "NOSPACE", rpc_pb2.AlarmType.CORRUPT: "CORRUPT"}
#: the alarm names an ``exclude`` can match
ALARM_NAMES = frozenset(rpc_pb2.AlarmType.keys())


_BY_NAME = {(m.service, m.name): m for m in METHODS}
RANGE: Method = _BY_NAME[("KV", "Range")]


class Store(Protocol):
    """What the check asks: the node's own state (the leader it follows, its alarms; None when it
    does not answer), and a request as an anonymous client."""

    async def node_state(self, timeout: float) -> tuple[int, Sequence[rpc_pb2.AlarmMember]] | None: ...

    async def forward_anonymous(self, method: Method, request: bytes, timeout: float) -> bytes: ...


class PipelineStore:
    """The proxy's pipeline and store client as the check asks them (no token: an anonymous client)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    async def node_state(self, timeout: float) -> tuple[int, Sequence[rpc_pb2.AlarmMember]] | None:
        answer = await self.pipeline.store.node_state(timeout)
        return None if answer is None else (answer.leader_id, answer.alarms)

    async def forward_anonymous(self, method: Method, request: bytes, timeout: float) -> bytes:
        return await self.pipeline.forward_as(None, method, request, timeout)


#: Go's context.DeadlineExceeded, as etcd words a read that ran out of time
DEADLINE = "context deadline exceeded"


def _details(error: BaseException) -> str:
    if isinstance(error, grpc.aio.AioRpcError):
        return DEADLINE if error.code() is grpc.StatusCode.DEADLINE_EXCEEDED else error.details() or ""
    if isinstance(error, TimeoutError):
        return DEADLINE
    return str(error) or type(error).__name__


async def check(store: Store, excluded: frozenset[str], serializable: bool) -> tuple[bool, str]:
    """(healthy, reason) as etcd's checkV3Health decides them, within CHECK_TIMEOUT in all (etcd's
    alarms and leader are its own; its read has the request timeout): each step has what is left."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CHECK_TIMEOUT
    try:
        state = await store.node_state(CHECK_TIMEOUT)
    except Exception:
        state = None
    leader, alarms = state if state is not None else (0, ())  # a node that does not answer leads nothing
    for alarm in alarms:
        name = rpc_pb2.AlarmType.Name(alarm.alarm) if alarm.alarm in rpc_pb2.AlarmType.values() else ""
        if name in excluded:
            continue
        return False, f"ALARM {_ALARMS.get(alarm.alarm, 'UNKNOWN')}"
    if not serializable and not leader:
        return False, "RAFT NO LEADER"
    request = rpc_pb2.RangeRequest(key=b"\x00", keys_only=True, limit=1, serializable=serializable)
    left = deadline - loop.time()
    if left <= 0:
        return False, f"RANGE ERROR:{DEADLINE}"
    try:
        async with asyncio.timeout(left):
            await store.forward_anonymous(RANGE, request.SerializeToString(), left)
    except Exception as e:
        details = _details(e)
        if details not in SERVED:
            return False, f"RANGE ERROR:{details}"
    return True, ""


class _Query(Protocol):
    """A request's query parameters, a name given more than once kept each time (aiohttp's)."""

    def getall(self, key: str, default: list[str], /) -> list[str]: ...


def excluded_alarms(query: _Query) -> frozenset[str]:
    """The alarm names among the ``exclude`` values: every value is read, as etcd reads them (the
    request line bounds how many), and only etcd's alarm names are kept, as only they can change
    an answer."""
    return frozenset(v for v in query.getall("exclude", []) if v in ALARM_NAMES)


class HealthChecker:
    """``check`` for the gateway: concurrent callers asking the same question (which alarms are
    excluded, serializable or not) share one check, so callers without a token, however many,
    cost the store at most one round per question at a time (a handful of questions: only the
    alarm names etcd has can change an answer)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._running: dict[tuple[frozenset[str], bool], asyncio.Future[tuple[bool, str]]] = {}

    async def check(self, excluded: frozenset[str], serializable: bool) -> tuple[bool, str]:
        key = (excluded & ALARM_NAMES, serializable)
        running = self._running.get(key)
        if running is None:
            running = asyncio.ensure_future(check(self.store, key[0], serializable))
            self._running[key] = running
            running.add_done_callback(lambda _: self._running.pop(key, None))
        return await asyncio.shield(running)  # one caller hanging up does not end the others' check


async def health(request: web.Request, checker: HealthChecker) -> web.Response:
    """GET /health as etcd's NewHealthHandler answers it."""
    if request.method != "GET":
        response = _go_error(405, "Method Not Allowed")
        response.headers["Allow"] = "GET"
        return response
    serializable = request.rel_url.query.get("serializable") == "true"
    healthy, reason = await checker.check(excluded_alarms(request.rel_url.query), serializable)
    body = json.dumps({"health": "true" if healthy else "false", "reason": reason}, separators=(",", ":"))
    if healthy:
        metrics.GATEWAY_HEALTH_CHECKS.labels("success").inc()
        return web.Response(status=200, text=body, content_type="text/plain", charset="utf-8")
    metrics.GATEWAY_HEALTH_CHECKS.labels("failure").inc()
    log.warning("/health error: %s", reason)
    return _go_error(503, body)


def _go_error(status: int, text: str) -> web.Response:
    """Go's http.Error: the text and a newline, text/plain, nosniff."""
    response = web.Response(status=status, text=text + "\n", content_type="text/plain", charset="utf-8")
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response
