"""kl's layers (shared/STYLE.md, "Layout"): the storage layer, ``kl.log``, imports nothing
above it, the errors sit at the bottom, the network server's core knows no protocol, and
no modules of kl import each other in a circle (counting every import: at the top, under
TYPE_CHECKING and inside functions)."""

from __future__ import annotations

import ast
import pathlib

import pytest

import kl

PACKAGE = pathlib.Path(kl.__file__).parent


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(node: ast.AST, modules: set[str]) -> set[str]:
    """The modules of kl that the imports under ``node`` name (``from kl.log import core``
    names kl.log.core; ``from kl.log import Log`` names kl.log)."""
    found: set[str] = set()
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import):
            found.update(alias.name for alias in child.names)
        elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
            for alias in child.names:
                submodule = f"{child.module}.{alias.name}"
                found.add(submodule if submodule in modules else child.module)
        else:
            found |= imported(child, modules)
    return found & modules


def imports() -> dict[str, set[str]]:
    """Each module of kl and the modules of kl it imports, anywhere in it (the compiled
    core, built from ``kl/log/_core.c``, counts as a module importing nothing)."""
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    compiled = {module_name(path.with_suffix(".py")) for path in PACKAGE.rglob("*.c")}
    modules = set(paths) | compiled
    found = {name: imported(ast.parse(path.read_text(), str(path)), modules) - {name} for name, path in paths.items()}
    return found | {name: set() for name in compiled}


GRAPH = imports()


def test_the_storage_layer_imports_only_itself_and_the_errors() -> None:
    upward = {
        (name, target)
        for name, targets in GRAPH.items()
        if name.startswith("kl.log")
        for target in targets
        if not target.startswith("kl.log") and target != "kl.errors"
    }
    assert not upward
    assert {name for name in GRAPH if name.startswith("kl.log.")} >= {
        f"kl.log.{module}"
        for module in (
            "message",
            "messageset",
            "segment",
            "state",
            "log",
            "locks",
            "flusher",
            "fsutil",
            "recovery",
            "retention",
            "importer",
            "dump",
            "config",
            "core",
            "pycore",
        )
    }


def test_the_server_core_imports_no_protocol() -> None:
    protocols = ("kl.net.kafka", "kl.net.wire", "kl.net.remote")
    assert not {target for target in GRAPH["kl.net.server"] if target.startswith(protocols)}
    assert "kl.net.server" in GRAPH["kl.net.daemon"]


def test_the_errors_import_nothing_of_kl() -> None:
    assert GRAPH["kl.errors"] == set()


def cycle_through(start: str) -> list[str] | None:
    """A circle of imports from ``start`` back to it, if there is one."""
    stack, seen = [(start, [start])], set()
    while stack:
        name, path = stack.pop()
        for target in GRAPH[name]:
            if target == start:
                return path + [start]
            if target not in seen:
                seen.add(target)
                stack.append((target, path + [target]))
    return None


@pytest.mark.parametrize("name", sorted(GRAPH))
def test_no_module_imports_itself_through_others(name: str) -> None:
    assert cycle_through(name) is None
