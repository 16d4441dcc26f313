"""A module's ``_``-prefixed names are its own: no other module imports them (``from m import _x``)
or reaches for them (``m._x``). What two modules share is public, under a name that says what it
is, in the module that owns the concept; so a private helper can change without a caller elsewhere
breaking, and nothing outside the proxy leans on the proxy's internals. Checked with ``ast`` over
every package of the product (generated ``*_pb2*.py`` left out); lint-imports checks the layers.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("proxy", "authstore", "raftgate", "protos", "bench")

#: (importing module, "module.name") -> why it cannot be avoided. Keep it empty.
ALLOWED: dict[tuple[str, str], str] = {}


def _files() -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "_pb2" in path.name:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


PROJECT_MODULES = {name for name, _ in _files()}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _ours(dotted: str) -> bool:
    """A module of the product (the standard library's documented ``os._exit`` is not ours to rename)."""
    return dotted.split(".")[0] in PACKAGES


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def violations(module: str, source: str, label: str, *, is_package: bool = False) -> list[str]:
    """``label:line: module.name`` for each private name of another module that ``source`` uses."""
    tree = ast.parse(source, label)
    found: list[tuple[int, str]] = []
    bound: dict[str, str] = {}  # local name -> the module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    bound[top] = top
        elif isinstance(node, ast.ImportFrom):
            origin = _absolute(module, is_package, node)
            for alias in node.names:
                if _private(alias.name) and origin != module and _ours(origin):
                    found.append((node.lineno, f"{origin}.{alias.name}"))
                elif f"{origin}.{alias.name}" in PROJECT_MODULES:
                    bound[alias.asname or alias.name] = f"{origin}.{alias.name}"
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and _private(node.attr)):
            continue
        dotted = _dotted(node.value)
        if dotted is None:
            continue
        head, _, rest = dotted.partition(".")
        if head not in bound:
            continue
        target = bound[head] + (f".{rest}" if rest else "")
        if target != module and target in PROJECT_MODULES:
            found.append((node.lineno, f"{target}.{node.attr}"))
    return [f"{label}:{line}: {name}" for line, name in sorted(set(found)) if (module, name) not in ALLOWED]


def test_no_module_uses_another_modules_private_names() -> None:
    bad = [v for module, path in _files()
           for v in violations(module, path.read_text(), str(path.relative_to(ROOT)),
                               is_package=path.name == "__init__.py")]
    assert not bad, "private names used outside their module (make them public where they belong):\n" + "\n".join(bad)


def test_the_check_finds_both_forms() -> None:
    """The rule itself: a private name imported, and one reached through a module, are found; a
    module's own private names and dunders are not."""
    source = ("import authstore.api.maintenance as m\nfrom proxy import main\nfrom proxy.main import _serve\n"
              "from raftgate import __version__\nimport authstore.api.stamp\n"
              "m._hash_all(); main._serve(); authstore.api.stamp._x; _own = 1\n"
              "import os\nos._exit(0); m.public; self._fine\n")
    found = violations("authstore.probe", source, "probe.py")
    names = [v.split(": ")[1] for v in found]
    assert names == ["proxy.main._serve", "authstore.api.maintenance._hash_all", "authstore.api.stamp._x",
                     "proxy.main._serve"], found


def _test_modules() -> Iterator[tuple[str, Path]]:
    for path in sorted((ROOT / "tests").rglob("*.py")):
        yield ".".join(path.relative_to(ROOT).with_suffix("").parts), path


def test_no_test_module_imports_another_test_module() -> None:
    """Issue 23: what two test modules share lives in ``tests/support/`` (or a folder's non-test
    module such as ``tests/raft/fakes.py``), so running, moving or deleting one test file never
    breaks another."""
    found = []
    for name, path in _test_modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = [node.module or ""] if isinstance(node, ast.ImportFrom) else (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for target in targets:
                if target.startswith("tests.") and target.rsplit(".", 1)[-1].startswith("test_"):
                    found.append(f"{name}:{node.lineno} imports {target}")
    assert not found, "move what is shared into tests/support/:\n" + "\n".join(found)
