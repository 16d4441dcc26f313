"""The outputs: terminal/Markdown table and a PNG chart (written without plotting libraries)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench import png

KINDS = ("raftgate", "etcd")


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
    return text


def verdict(row: dict[str, Any]) -> str:
    ratio = row.get("ratio")
    if ratio is None:
        return ""
    ahead = ratio >= 1 if row["better"] == "higher" else ratio <= 1
    return "raftgate" if ahead else "etcd"


def line(row: dict[str, Any]) -> str:
    ratio = row.get("ratio")
    parts = [f"{k} {cell(row, k)}" for k in KINDS if k in row]
    r = f"ratio {ratio:.2f}" if ratio is not None else "ratio —"
    return f"{row['row']}: " + ", ".join(parts) + f", {r}"


def table(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    head = [
        f"Machine: {m['nproc']} cores, {m['cpu_model']}, {m['memory']} RAM, Python {m['python']}, grpcio {m['grpcio']}",
        f"Command: `{doc['command'].strip()}` ({doc['wall_seconds']:.0f} s); etcd: {doc['targets']['etcd']}",
        "bcrypt limit (cores ÷ checkpw): " + ", ".join(
            f"cost {c}: {v['limit_per_s']:.1f}/s ({v['checkpw_s'] * 1000:.1f} ms per check)"
            for c, v in doc["bcrypt"].items()),
        "ratio = raftgate ÷ etcd; for /s rows higher is better, for ms and s rows lower is better; "
        "Authenticate rows show (% of the bcrypt limit).",
        "",
    ]  # fmt: skip
    rows = [["row", "raftgate", "etcd", "ratio", "ahead"]]
    for r in doc["rows"]:
        ratio = r.get("ratio")
        rows.append([r["row"], cell(r, "raftgate"), cell(r, "etcd"), f"{ratio:.2f}" if ratio is not None else "—",
                     verdict(r)])  # fmt: skip
    widths = [max(len(x[i]) for x in rows) for i in range(5)]
    out = []
    for i, x in enumerate(rows):
        out.append("| " + " | ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in
                                     enumerate(zip(x, widths, strict=True))) + " |")  # fmt: skip
        if i == 0:
            out.append("|" + "|".join("-" * (w + 1) + (":" if j else "-") for j, w in enumerate(widths)) + "|")
    return "\n".join(head + out)


# ---- chart
BG, FG, GRID, RG, ET, AHEAD, BEHIND = (255, 255, 255), (30, 30, 30), (215, 215, 215), (52, 101, 164), \
    (204, 102, 0), (46, 139, 87), (190, 50, 50)  # fmt: skip


def chart(doc: dict[str, Any], path: Path) -> None:
    """One bar per row: log2 of how far raftgate is ahead (green, right) or behind (red, left) of
    etcd, "lower is better" rows inverted so right is always better for raftgate."""
    rows = doc["rows"]
    scale = 2
    label_w = max([len(r["row"]) for r in rows] + [40]) * png.CHAR_W * scale + 20
    plot_w, bar_h, top = 560, 9 * scale, 60
    width = label_w + plot_w + 150
    height = top + max(1, len(rows)) * (bar_h + 4) + 50
    img = png.Image(width, height, BG)
    img.text(10, 10, "RAFTGATE VS ETCD: HOW MANY TIMES FASTER (RIGHT) OR SLOWER (LEFT), LOG SCALE", FG, scale)
    m = doc["machine"]
    img.text(10, 28, f"{m['nproc']} CORES, {m['cpu_model']}, PYTHON {m['python']}", FG, scale)
    x0 = label_w + plot_w // 2
    span = 4.0  # log2: 1/16x .. 16x
    for k in range(-4, 5):
        x = x0 + int(k / span * (plot_w // 2))
        img.rect(x, top - 4, 1, height - top - 40, GRID if k else FG)
        lab = f"{2**k:g}X" if k >= 0 else f"1/{2**-k}X"
        img.text(x - len(lab) * png.CHAR_W * scale // 2, height - 32, lab, FG, scale)
    for i, r in enumerate(rows):
        y = top + i * (bar_h + 4)
        img.text(10, y + 2, r["row"], FG, scale)
        ratio = r.get("ratio")
        if ratio is None or ratio <= 0:
            img.text(x0 + 6, y + 2, "N/A", FG, scale)
            continue
        v = math.log2(ratio) if r["better"] == "higher" else -math.log2(ratio)
        v = max(-span, min(span, v))
        length = int(abs(v) / span * (plot_w // 2))
        colour = AHEAD if v >= 0 else BEHIND
        img.rect(x0 if v >= 0 else x0 - length, y, max(1, length), bar_h, colour)
        img.text(label_w + plot_w + 10, y + 2, f"{ratio:.2f}", FG, scale)
    img.save(path)
