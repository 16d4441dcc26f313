"""Go ``time.ParseDuration`` for the JWT ``ttl=`` option (shared with the store: raftgate.go_duration)."""

from raftgate.go_duration import parse_go_duration

__all__ = ["parse_go_duration"]
