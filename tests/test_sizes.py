"""Small pieces with one job: no class over 150 lines, no function over 60 (the docstring not counted;
the Triton kernels excepted, a kernel is one function by nature), no laboratory module over 400 lines."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "posenc"
CLASS_LINES, FUNCTION_LINES, LAB_MODULE_LINES = 150, 60, 400


def _span(node) -> int:
    """Lines of a def or class, less its docstring's."""
    body = node.body
    first = body[0] if body else None
    doc = 0
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        doc = first.end_lineno - first.lineno + 1
    return node.end_lineno - node.lineno + 1 - doc


def oversized(source: str, triton: bool = False) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and _span(node) > CLASS_LINES:
            found.append(f"class {node.name}: {_span(node)} lines")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not triton:
            if _span(node) > FUNCTION_LINES:
                found.append(f"def {node.name}: {_span(node)} lines")
    return found


def test_no_class_or_function_is_oversized():
    found = {
        str(path.relative_to(SRC)): oversized(path.read_text(), triton="triton" in path.name)
        for path in sorted(SRC.rglob("*.py"))
    }
    assert {path: items for path, items in found.items() if items} == {}


def test_no_lab_module_is_oversized():
    sizes = {path.name: len(path.read_text().splitlines()) for path in (SRC / "lab").glob("*.py")}
    assert {name: n for name, n in sizes.items() if n > LAB_MODULE_LINES} == {}


def test_the_size_check_finds_a_long_function_and_skips_docstrings():
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    doc = '    """' + "\n" * 30 + '    """\n'
    assert oversized(f"def f():\n{doc}{body}\n") == [f"def f: {FUNCTION_LINES + 1} lines"]
    assert oversized(f"def f():\n{doc}{body}\n", triton=True) == []
    assert oversized(f"def f():\n{doc}    pass\n") == []
