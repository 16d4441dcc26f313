"""The outputs: the terminal/Markdown table and the PNG chart (matplotlib, the optional ``bench``
extra: ``pip install -e '.[bench]'``; without it no chart is written and the bench says so)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

KINDS = ("raftgate", "etcd")
#: Every target a row may hold, in column order (the floor only on Put, Range and watch rows).
COLUMNS = ("raftgate", "etcd", "floor")
#: A cell whose rounds lie further apart than this share of their median is marked ``~``: the
#: machine (a small VM here) moved under that row, and its ratios say less than the others'.
SPREAD = 0.2
SPREAD_NOTE = (f"~ marks a value whose rounds lie more than {SPREAD * 100:.0f} % of their median apart: the "
               "machine moved under that row, so its ratios say less than the others'.")


def spread(result: dict[str, Any]) -> float | None:
    """How far a target's rounds in one row lie apart, as a share of their median (None: fewer
    than two rounds, or none with a value). A round that failed beside one that did, or rounds that differ
    around a median of zero, are as far apart as can be (infinity)."""
    given = list(result.get("rounds") or ())
    rounds = [float(x) for x in given if x is not None]
    if not rounds or len(given) < 2:
        return None
    if len(rounds) < len(given):
        return math.inf
    middle = statistics.median(rounds)
    width = max(rounds) - min(rounds)
    if not middle:
        return math.inf if width else 0.0
    return width / middle


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "/s":
        return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"
    if unit == "ms":
        return f"{value:.1f} ms" if value >= 10 else f"{value:.2f} ms"
    return f"{value:.2f} s"


def cell(row: dict[str, Any], kind: str) -> str:
    r = row.get(kind)
    if r is None:
        return "not run"
    text = fmt(r["value"], row["unit"])
    frac = r.get("fraction_of_bcrypt_limit")
    if frac is not None:
        text += f" ({frac:.0%})"
    if r["value"] is None and r.get("error"):
        text += " err"
    elif r.get("errors"):
        text += f" [{r['errors']} err]"
    apart = spread(r)
    if apart is not None and apart > SPREAD:
        text += " ~"
    return text


def shares(row: dict[str, Any]) -> dict[str, float | None]:
    """raftgate ÷ etcd (``ratio``), raftgate ÷ the floor and etcd ÷ the floor (``of_floor``,
    ``etcd_of_floor``), from the row's values; None where a value is missing or zero. For a /s row
    raftgate ÷ floor is the share of the floor's throughput raftgate reaches."""

    def value(kind: str) -> float | None:
        v = row.get(kind, {}).get("value") if isinstance(row.get(kind), dict) else None
        return float(v) if v is not None else None

    def div(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    rg, et, fl = value("raftgate"), value("etcd"), value("floor")
    return {"ratio": div(rg, et), "of_floor": div(rg, fl), "etcd_of_floor": div(et, fl)}


def ab_shares(row: dict[str, Any], a: str, b: str) -> dict[str, float | None]:
    """An A/B row's ``ab_ratio`` = B ÷ A, and each variant's share of the floor (``a_of_floor``,
    ``b_of_floor``); None where a value is missing or zero."""

    def value(kind: str) -> float | None:
        r = row.get(kind)
        return float(r["value"]) if isinstance(r, dict) and r.get("value") is not None else None

    def div(x: float | None, y: float | None) -> float | None:
        return x / y if x is not None and y else None

    va, vb, fl = value(a), value(b), value("floor")
    return {"ab_ratio": div(vb, va), "a_of_floor": div(va, fl), "b_of_floor": div(vb, fl)}


def ab_table(doc: dict[str, Any]) -> str:
    """The table of an A/B run (``--ab``): A, B and the floor side by side, B÷A and each ÷ floor."""
    m = doc["machine"]
    a, b = (v["name"] for v in doc["ab"])
    head = [
        f"Machine: {m['nproc']} cores, {m['cpu_model']}, {m['memory']} RAM, Python {m['python']}, grpcio {m['grpcio']}",
        f"Command: `{doc['command'].strip()}` ({doc['wall_seconds']:.0f} s)",
        *(f"{v['name']}: raftgate from {v['build']}"
          + (" with " + ", ".join(f"{k}={x}" for k, x in v["env"].items()) if v["env"] else "")
          for v in doc["ab"]),
        f"Measured in one rotation ({a}, {b}, floor, {a}, {b}, floor, ...). {b}÷{a}: for /s rows above 1 means "
        f"{b} is faster, for ms and s rows below 1 does.",
        SPREAD_NOTE,
        "",
    ]  # fmt: skip
    rows = [["row", a, b, "floor", f"{b}÷{a}", f"{a}÷floor", f"{b}÷floor"]]
    for r in doc["rows"]:
        rows.append([r["row"], cell(r, a), cell(r, b), cell(r, "floor") if "floor" in r else "—",
                     _ratio(r.get("ab_ratio")), _ratio(r.get("a_of_floor")), _ratio(r.get("b_of_floor"))])  # fmt: skip
    return "\n".join(head + _grid(rows))


def _grid(rows: list[list[str]]) -> list[str]:
    widths = [max(len(x[i]) for x in rows) for i in range(len(rows[0]))]
    out = []
    for i, x in enumerate(rows):
        out.append("| " + " | ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in
                                     enumerate(zip(x, widths, strict=True))) + " |")  # fmt: skip
        if i == 0:
            out.append("|" + "|".join("-" * (w + 1) + (":" if j else "-") for j, w in enumerate(widths)) + "|")
    return out


def _ratio(value: float | None) -> str:
    return f"{value:.2f}" if value is not None else "—"


def verdict(row: dict[str, Any]) -> str:
    ratio = row.get("ratio")
    if ratio is None:
        return ""
    ahead = ratio >= 1 if row["better"] == "higher" else ratio <= 1
    return "raftgate" if ahead else "etcd"


def line(row: dict[str, Any]) -> str:
    if "ab_ratio" in row:  # an A/B run: its variants, then the floor
        names = [k for k, v in row.items() if isinstance(v, dict) and "value" in v and k != "floor"]
        parts = [f"{k} {cell(row, k)}" for k in [*names, "floor"] if k in row]
        return f"{row['row']}: " + ", ".join(parts) + f", {'÷'.join(reversed(names))} {_ratio(row['ab_ratio'])}"
    parts = [f"{k} {cell(row, k)}" for k in COLUMNS if k in row]
    r = f"raftgate÷etcd {_ratio(row.get('ratio'))}"
    if row.get("floor") is not None:
        r += f", raftgate÷floor {_ratio(row.get('of_floor'))}"
    return f"{row['row']}: " + ", ".join(parts) + f", {r}"


def table(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    head = [
        f"Machine: {m['nproc']} cores, {m['cpu_model']}, {m['memory']} RAM, Python {m['python']}, grpcio {m['grpcio']}",
        f"Command: `{doc['command'].strip()}` ({doc['wall_seconds']:.0f} s); etcd: {doc['targets']['etcd']}",
        "bcrypt limit (cores ÷ checkpw): " + ", ".join(
            f"cost {c}: {v['limit_per_s']:.1f}/s ({v['checkpw_s'] * 1000:.1f} ms per check)"
            for c, v in doc["bcrypt"].items()),
        "floor = a bare gRPC-Python asyncio server answering Put and Range with canned bytes (the limit of any "
        "Python gRPC server here) and fanning each Put out to its Watch streams with a writer per stream (a bare "
        "reference for that row), measured in the same rotation (bench/floor.py).",
        "raftgate÷etcd and raftgate÷floor: for /s rows higher is better (÷ floor: the share of the floor reached), "
        "for ms and s rows lower is better; Authenticate rows show (% of the bcrypt limit).",
        SPREAD_NOTE,
        "",
    ]  # fmt: skip
    if doc.get("settings", {}).get("proxy_workers", 1) > 1:
        head.insert(-1, f"raftgate's client proxy ran {doc['settings']['proxy_workers']} worker processes "
                        "(--proxy-workers).")  # fmt: skip
    rows = [["row", "raftgate", "etcd", "floor", "raftgate÷etcd", "raftgate÷floor", "ahead"]]
    for r in doc["rows"]:
        rows.append([r["row"], cell(r, "raftgate"), cell(r, "etcd"), cell(r, "floor") if "floor" in r else "—",
                     _ratio(r.get("ratio")), _ratio(r.get("of_floor")), verdict(r)])  # fmt: skip
    return "\n".join(head + _grid(rows))


# ---- chart
COLOURS = {"raftgate": "#3465a4", "etcd": "#cc6600", "floor": "#888888"}


def chart(doc: dict[str, Any], path: Path) -> str | None:
    """Writes the chart: per row, raftgate, etcd and the floor side by side (log scale; one panel
    for /s rows, one for ms and s rows). Returns why it was not written (matplotlib missing), or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, never a window
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]'); no chart written"
    panels = [(title, [r for r in doc["rows"] if pick(r["unit"])]) for title, pick in (
        ("throughput (higher is better)", lambda u: u == "/s"),
        ("latency and recovery (lower is better)", lambda u: u != "/s"))]  # fmt: skip
    panels = [(t, rows) for t, rows in panels if rows]
    if not panels:
        return "no rows to chart"
    heights = [max(1.0, 0.42 * len(rows) + 0.8) for _, rows in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(13, sum(heights) + 1.2),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)  # fmt: skip
    bar = 0.27
    for ax, (title, rows) in zip(axes[:, 0], panels, strict=True):
        top = 0.0
        for j, kind in enumerate(COLUMNS):
            ys, xs = [], []
            for i, r in enumerate(rows):
                v = (r.get(kind) or {}).get("value")
                if v is not None and v > 0:
                    ys.append(i + (j - 1) * bar)
                    xs.append(v)
            ax.barh(ys, xs, height=bar, color=COLOURS[kind], label=kind)
            top = max([top, *xs])
            for y, x in zip(ys, xs, strict=True):
                unit = rows[0]["unit"] if len({r["unit"] for r in rows}) == 1 else ""
                ax.text(x, y, " " + fmt(x, unit or "/s").replace(" ms", "").replace(" s", ""), va="center",
                        fontsize=6)  # fmt: skip
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([_label(r) for r in rows], fontsize=7)
        ax.set_ylim(len(rows) - 0.5, -0.5)  # first row on top, no margins
        ax.set_xscale("log")
        if top > 0:
            ax.set_xlim(right=top * 2)  # room for the value labels
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:,g}"))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _pos: f"{v:,g}" if f"{v:g}"[0] in "25" else ""))
        ax.set_title(title, fontsize=9, loc="left")
        ax.grid(axis="x", which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    m = doc["machine"]
    first = axes[0, 0]
    first.set_title(f"raftgate, etcd and the floor (a bare gRPC-Python server), {m['nproc']} cores, {m['cpu_model']}, "
                    f"Python {m['python']}\n{first.get_title(loc='left')}", fontsize=9, loc="left")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=90, bbox_inches="tight", pil_kwargs={"optimize": True})
    plt.close(fig)
    return None


def _label(row: dict[str, Any]) -> str:
    text = row["row"]
    if row.get("of_floor") is not None and row["unit"] == "/s":
        text += f"  [{row['of_floor']:.2f} of floor]"
    if row.get("ratio") is not None:
        text += f"  [{row['ratio']:.2f}× etcd]"
    return text
