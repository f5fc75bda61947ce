"""The two near-free biLMs that measure the host cost of the output width (issue 36).

Both have 2 LSTM layers of 32 cells and a tiny char CNN, so the model's own cost is
small; they differ only in the projection: 512 gives the standard 3 x 1024 outputs,
16 gives 3 x 32. ``(CPU of elmo embed with wide - CPU with narrow) / tokens`` is what
the width costs the host side per token (BENCHMARKS.md, "Host cost of the width").

    .venv/bin/python bench/near_free_models.py runs/near-free
    # -> runs/near-free/wide (3 x 1024) and runs/near-free/narrow (3 x 32)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PROJECTIONS = {"wide": 512, "narrow": 16}  # outputs 3 x 2*projection


def near_free_model(folder: Path, projection: int) -> Path:
    """A seeded near-free biLM with ``projection`` (outputs ``3 x 2 * projection``)."""
    import torch

    from elmo_model import BiLM, BiLMConfig, save_model_dir

    torch.manual_seed(0)
    config = BiLMConfig(n_layers=2, lstm_dim=32, projection_dim=projection,
                        char_embedding_dim=4, filters=((1, 8), (2, 8)), n_highway=1)
    return save_model_dir(BiLM(config), folder)


def build_both(folder: Path) -> dict[str, Path]:
    """``wide`` and ``narrow`` under ``folder`` (rebuilt each call: seeded, so the same)."""
    return {name: near_free_model(folder / name, projection)
            for name, projection in PROJECTIONS.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="where to write wide/ and narrow/")
    args = parser.parse_args()
    for name, path in build_both(args.folder).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
