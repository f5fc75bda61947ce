"""Reading a model's ``options.json``, kept free of torch so a tokenizer lookup stays light."""

from __future__ import annotations

import json
from pathlib import Path

from elmo_model.errors import ElmoUserError

OPTIONS_FILE = "options.json"


def read_options_json(path: str | Path) -> dict:
    """The parsed ``options.json``; an ElmoUserError naming the file when it is missing or bad."""
    path = Path(path)
    if not path.is_file():
        raise ElmoUserError(f"options file not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ElmoUserError(f"{path}: not valid JSON ({error})") from None
