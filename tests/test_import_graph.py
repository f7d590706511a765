"""posenc's modules import one another without a cycle, counting imports inside functions and under
TYPE_CHECKING (docs/architecture.md: the layers only ever import downwards)."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _module_names() -> dict[str, Path]:
    names = {}
    for path in (SRC / "posenc").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _imports(module: str, path: Path, names: dict[str, Path]) -> set[str]:
    """The posenc modules ``module`` imports anywhere in its source (a name imported from a package that
    is itself a module counts as that module)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                found.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in names else source)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in names and name != module}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_itself_back():
    names = _module_names()
    graph = {module: _imports(module, path, names) for module, path in names.items()}
    assert sum(map(len, graph.values())) > 100  # the graph was read
    assert cycles(graph) == []


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def private_imports(names: dict[str, Path]) -> list[str]:
    """``module: name`` for every private name (a leading underscore) that a posenc module imports from
    another posenc module; a private module itself (``_checks``) may be imported, its public names too."""
    found = []
    for module, path in names.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
                continue
            base = package[: len(package) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            if not source.startswith("posenc"):
                continue
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and f"{source}.{alias.name}" not in names:
                    found.append(f"{module}: {source}.{alias.name}")
    return found


def test_no_module_imports_another_modules_private_names():
    assert private_imports(_module_names()) == []


def test_the_private_import_check_finds_one(tmp_path):
    (tmp_path / "a.py").write_text("from .b import _helper, public\nfrom . import _checks\n")
    (tmp_path / "b.py").write_text("def _helper(): ...\n")
    (tmp_path / "_checks.py").write_text("")
    names = {
        "posenc.a": tmp_path / "a.py",
        "posenc.b": tmp_path / "b.py",
        "posenc._checks": tmp_path / "_checks.py",
    }
    assert private_imports(names) == ["posenc.a: posenc.b._helper"]
