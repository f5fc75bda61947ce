"""``bench/code_shape.py``: the layers stay apart and no import circle appears."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _code_shape():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("code_shape", REPO / "bench" / "code_shape.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_layers_and_circles() -> None:
    shape = _code_shape()
    known = shape.modules(REPO)
    graph = {name: shape.imports(shape.ast.parse(path.read_text()), known, name)
             for name, path in known.items()}
    assert shape.crossings(graph) == []  # contract < write | read
    # The sense index's circle is being taken apart (issue 37's follow-ups); no other.
    assert all(all(m.startswith("pipeline.lookup.index.") for m in circle)
               for circle in shape.circles(graph))
    assert shape.circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert shape.crossings({"schemas.x": {"pipeline.write.y"},
                            "pipeline.lookup.z": {"schemas.x"}}) == [
        ("schemas.x", "pipeline.write.y")]
