"""The product's shape, for anyone to check again: import circles, the layers' directions,
folder sizes, and the largest modules and functions.

    .venv/bin/python tools/code_shape.py [--top 10]

Reads the source only (``ast``; nothing is imported). The product is ``elmo_model/``,
``schemas/``, ``pipeline/`` and ``jobs/``. An import anywhere in a module counts, also one
inside a function. It prints:

- every import circle (a set of modules that import each other, directly or not);
- imports that cross the layers the wrong way: the storage contract (``schemas/``) importing
  either path, the write path (``pipeline/write/``) importing the read path
  (``pipeline/lookup/``) or back (the CLI modules and ``jobs/`` may use both);
- folders with more than ``MAX_MODULES`` modules directly in them;
- the largest modules (lines) and functions (lines, decorators included), those over the
  limits the project holds itself to (450 and 100 lines) marked.

Exit status 1 when a module or function is over its limit, a layer is crossed or a
circle exists (``problems``: what tests/cli/test_code_shape.py holds to none).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("elmo_model", "schemas", "pipeline", "jobs")
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 100
MAX_MODULES = 15
CONTRACT, WRITE, READ = "schemas", "pipeline.write", "pipeline.lookup"


def modules(repo: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every product module."""
    found = {}
    for package in PACKAGES:
        for path in sorted((repo / package).rglob("*.py")):
            name = ".".join(path.relative_to(repo).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports(tree: ast.AST, known: dict[str, Path], here: str) -> set[str]:
    """The product modules a module imports (``from a import b`` counts as ``a.b`` when
    that is a module, else as ``a``)."""

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known
                     else node.module for alias in node.names]
        else:
            continue
        out.update(r for n in names if (r := resolve(n)) is not None)
    out.discard(here)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
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


def layer(name: str) -> str | None:
    for prefix in (CONTRACT, WRITE, READ):
        if name == prefix or name.startswith(prefix + "."):
            return prefix
    return None


def crossings(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs that break the layering."""
    wrong = {CONTRACT: {WRITE, READ}, WRITE: {READ}, READ: {WRITE}}
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if layer(b) in wrong.get(layer(a) or "", set()))


def functions(tree: ast.AST, module: str) -> list[tuple[int, str]]:
    """(lines, qualified name) of every function and method."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}.{child.name}"
                if not isinstance(child, ast.ClassDef):
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    found.append((child.end_lineno - first + 1, name))
                visit(child, name)

    visit(tree, module)
    return found


def problems(repo: Path = REPO) -> list[str]:
    """Every import circle, layer crossing, and module or function over its limit, one line
    each: what the project holds to none."""
    known = modules(repo)
    texts = {name: path.read_text(encoding="utf-8") for name, path in known.items()}
    trees = {name: ast.parse(text) for name, text in texts.items()}
    graph = {name: imports(tree, known, name) for name, tree in trees.items()}
    found = [f"import circle: {' <-> '.join(c)}" for c in circles(graph)]
    found += [f"layer crossed: {a} -> {b}" for a, b in crossings(graph)]
    found += [f"module over {MAX_MODULE_LINES} lines: {name} ({n})" for name, text in
              texts.items() if (n := len(text.splitlines())) > MAX_MODULE_LINES]
    found += [f"function over {MAX_FUNCTION_LINES} lines: {name} ({n})"
              for tree_name, tree in trees.items() for n, name in functions(tree, tree_name)
              if n > MAX_FUNCTION_LINES]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=10, help="largest N modules and functions")
    args = parser.parse_args(argv)
    known = modules(REPO)
    trees = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in known.items()}
    graph = {name: imports(tree, known, name) for name, tree in trees.items()}
    lines = {name: len(known[name].read_text(encoding="utf-8").splitlines()) for name in known}
    funcs = sorted((f for name, tree in trees.items() for f in functions(tree, name)),
                   reverse=True)
    folders: dict[Path, int] = defaultdict(int)
    for path in known.values():
        folders[path.parent.relative_to(REPO)] += 1

    found = circles(graph)
    print(f"import circles: {len(found) or 'none'}")
    for component in found:
        print("  " + " <-> ".join(component))
    crossed = crossings(graph)
    print(f"layer crossings (contract < write | read): {len(crossed) or 'none'}")
    for importer, imported in crossed:
        print(f"  {importer} -> {imported}")
    crowded = {f: n for f, n in folders.items() if n > MAX_MODULES}
    print(f"folders over {MAX_MODULES} modules: "
          + (", ".join(f"{f}/ ({n})" for f, n in sorted(crowded.items())) or "none"))
    print(f"\n{len(known)} modules, {sum(lines.values()):,} lines; largest "
          f"(limit {MAX_MODULE_LINES}):")
    for name in sorted(lines, key=lines.get, reverse=True)[:args.top]:
        mark = "  OVER" if lines[name] > MAX_MODULE_LINES else ""
        print(f"  {lines[name]:5d}  {name}{mark}")
    print(f"\nlargest functions (limit {MAX_FUNCTION_LINES}):")
    for n, name in funcs[:args.top]:
        print(f"  {n:5d}  {name}{'  OVER' if n > MAX_FUNCTION_LINES else ''}")
    return 1 if problems(REPO) else 0


if __name__ == "__main__":
    sys.exit(main())
