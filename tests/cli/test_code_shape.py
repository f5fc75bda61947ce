"""``tools/code_shape.py``: no import circle, the layers apart, modules and functions within
the limits it documents."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def _code_shape() -> ModuleType:
    spec = importlib.util.spec_from_file_location("code_shape", REPO / "tools" / "code_shape.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("code_shape", module)
    spec.loader.exec_module(module)
    return module


def test_the_product_has_none_of_the_problems_it_reports() -> None:
    assert _code_shape().problems(REPO) == []


def test_what_counts_as_a_problem(tmp_path: Path) -> None:
    shape = _code_shape()
    assert shape.circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert shape.crossings({"schemas.x": {"pipeline.write.y"},
                            "pipeline.lookup.z": {"schemas.x"}}) == [
        ("schemas.x", "pipeline.write.y")]
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "a.py").write_text("import schemas.b\n")
    body = "\n".join(["def long() -> None:"] + ["    pass"] * shape.MAX_FUNCTION_LINES)
    (tmp_path / "schemas" / "b.py").write_text("import schemas.a\n" + body + "\n")
    (tmp_path / "schemas" / "c.py").write_text("x = 1\n" * (shape.MAX_MODULE_LINES + 1))
    assert shape.problems(tmp_path) == [
        "import circle: schemas.a <-> schemas.b",
        f"module over {shape.MAX_MODULE_LINES} lines: schemas.c "
        f"({shape.MAX_MODULE_LINES + 1})",
        f"function over {shape.MAX_FUNCTION_LINES} lines: schemas.b.long "
        f"({shape.MAX_FUNCTION_LINES + 1})"]
