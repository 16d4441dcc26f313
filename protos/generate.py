"""Regenerates the Python code for every .proto under protos/ (``python -m protos.generate``).

Output is written next to each source; ``--out DIR`` writes elsewhere, which the staleness test
uses to compare a fresh generation with the committed files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sources() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "protos").rglob("*.proto"))


def generate(out: Path) -> None:
    import grpc_tools
    from grpc_tools import protoc

    include = str(Path(grpc_tools.__file__).parent / "_proto")
    args = ["protoc", f"-I{ROOT}", f"-I{include}", f"--python_out={out}", f"--pyi_out={out}",
            f"--grpc_python_out={out}", *sources()]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT)
    generate(parser.parse_args(argv).out)


if __name__ == "__main__":
    main(sys.argv[1:])
