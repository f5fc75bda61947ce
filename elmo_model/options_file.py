"""A model directory's files: reading its ``options.json``, finding its weights, its
fingerprint. Kept free of torch, so that a tokenizer lookup or a check of which model made
a dataset stays light."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from elmo_model.errors import ElmoUserError

OPTIONS_FILE = "options.json"
SAFETENSORS_FILE = "weights.safetensors"
HDF5_FILE = "weights.hdf5"


def read_options_json(path: str | Path) -> dict:
    """The parsed ``options.json``; an ElmoUserError naming the file when it is missing or bad."""
    path = Path(path)
    if not path.is_file():
        raise ElmoUserError(f"options file not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ElmoUserError(f"{path}: not valid JSON ({error})") from None


def find_weights(model_dir: str | Path) -> Path:
    model_dir = Path(model_dir)
    for name in (SAFETENSORS_FILE, HDF5_FILE):
        if (model_dir / name).is_file():
            return model_dir / name
    raise ElmoUserError(f"{model_dir}: no {SAFETENSORS_FILE} or {HDF5_FILE} in the model "
                        "directory")


def model_fingerprint(options_path: str | Path, weights_path: str | Path) -> str:
    """sha256 over the options file's bytes, then the weights file's bytes."""
    digest = hashlib.sha256()
    for path in (options_path, weights_path):
        with open(path, "rb") as handle:
            for block in iter(lambda h=handle: h.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def model_dir_files(model_dir: str | Path) -> tuple[Path, Path]:
    """``(options, weights)`` of a model directory: its ``options.json`` (an ElmoUserError
    when missing) and ``find_weights``'s weights file."""
    model_dir = Path(model_dir)
    if not (model_dir / OPTIONS_FILE).is_file():
        raise ElmoUserError(f"{model_dir}: no {OPTIONS_FILE} in the model directory")
    return model_dir / OPTIONS_FILE, find_weights(model_dir)
