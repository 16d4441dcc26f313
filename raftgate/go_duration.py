"""Go ``time.ParseDuration``, so etcd's duration strings (JWT ``ttl=``, --auth-lockout-duration) work unchanged."""

from __future__ import annotations

import re
from decimal import Decimal

_UNIT_NS: dict[str, int] = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # micro sign
    "\u03bcs": 1_000,  # greek mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
#: ASCII digits only, as Go: Python's \d would take other scripts' digits (U+0661 as 1)
_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)([^0-9.]+)")
_MAX_NS = (1 << 63) - 1


def parse_go_duration(text: str) -> int:
    """Nanoseconds for a Go duration string like ``300ms``, ``1.5h``, ``2h45m``, ``-1m`` or ``0``.

    Raises ValueError with Go's wording for anything Go would reject.
    """
    orig = text
    if not text:
        raise ValueError(f'time: invalid duration "{orig}"')
    sign = 1
    if text[0] in "+-":
        sign = -1 if text[0] == "-" else 1
        text = text[1:]
    if text == "0":
        return 0
    if not text:
        raise ValueError(f'time: invalid duration "{orig}"')
    total = Decimal(0)
    pos = 0
    while pos < len(text):
        match = _PART.match(text, pos)
        if not match:
            raise ValueError(f'time: invalid duration "{orig}"')
        number, unit = match.groups()
        if number in ("", "."):
            raise ValueError(f'time: invalid duration "{orig}"')
        if unit not in _UNIT_NS:
            raise ValueError(f'time: unknown unit "{unit}" in duration "{orig}"')
        total += Decimal(number) * _UNIT_NS[unit]
        pos = match.end()
    if total > _MAX_NS:
        raise ValueError(f'time: invalid duration "{orig}"')
    return sign * int(total)
