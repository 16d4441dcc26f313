"""An HTTP client that discovers etcd members through the JSON gateway, as Patroni's etcd3 DCS does
(patroni/dcs/etcd3.py): seeds from its configuration, ``/v3/auth/authenticate``,
``/v3/cluster/member/list``, then the members' clientURLs, moving on to the next URL when one fails.
etcd3gw (OpenStack's gateway client) does the key-value calls on the URL in use."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import etcd3gw
import requests


class Unreachable(Exception):
    pass


class DiscoveringClient:
    """Patroni's way: seeds from its config, ``/v3/auth/authenticate``, ``/v3/cluster/member/list``
    on the first seed that answers, then the members' clientURLs; a URL that fails is left for the
    next one (and the list is asked again). etcd3gw does the key-value calls on the URL in use."""

    def __init__(self, seeds: list[str], user: tuple[str, str]) -> None:
        self.machines = list(seeds)
        self.user = user
        self.token: str | None = None

    def _post(self, base: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.token is not None:
            headers["Authorization"] = self.token
        request = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return json.loads(answer.read())  # type: ignore[no-any-return]
        except urllib.error.HTTPError as e:
            error = json.loads(e.read() or b"{}")
            if e.code == 401 and "invalid auth token" in str(error.get("error")):
                self.token = None
            raise
        except (urllib.error.URLError, OSError) as e:
            raise Unreachable(f"{base}: {e}") from e

    def call(self, path: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """(the URL that answered, its answer): each known machine in turn, as Patroni fails over."""
        errors = []
        for base in list(self.machines):
            try:
                if self.token is None:
                    self.token = self._post(base, "/v3/auth/authenticate",
                                            {"name": self.user[0], "password": self.user[1]})["token"]
                return base, self._post(base, path, body)
            except (Unreachable, urllib.error.HTTPError) as e:
                errors.append(str(e))
        raise Unreachable("; ".join(errors))

    def refresh(self) -> list[dict[str, Any]]:
        """member/list, then the members' clientURLs are the machines (Patroni's machines cache)."""
        _, answer = self.call("/v3/cluster/member/list", {})
        members = answer["members"]
        urls = [url for m in members for url in m.get("clientURLs", [])]
        assert urls, answer
        self.machines = urls
        return members  # type: ignore[no-any-return]

    def etcd3gw(self, base: str) -> etcd3gw.Etcd3Client:
        """OpenStack's gateway client on one discovered URL, carrying the token."""
        host, port = base.removeprefix("http://").rsplit(":", 1)
        session = requests.Session()
        assert self.token is not None
        session.headers["Authorization"] = self.token
        return etcd3gw.Etcd3Client(host=host, port=int(port), session=session, timeout=30)

    def put_get(self, key: str, value: str) -> str:
        """A put and a get through etcd3gw on the first machine that answers."""
        for base in list(self.machines):
            client = self.etcd3gw(base)
            try:
                assert client.put(key, value)
                got = client.get(key)
            except etcd3gw.exceptions.ConnectionFailedError:
                continue
            return got[0].decode() if isinstance(got[0], bytes) else str(got[0])
        raise Unreachable(f"no machine of {self.machines} answered")
