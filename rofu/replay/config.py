"""Where the benchmark data lives: `--data-dir`, else ROFU_DATA_DIR, else ../shared/data."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def data_dir(explicit: Path | str | None = None) -> Path:
    """The benchmark data folder.

    Raises:
        FileNotFoundError: no folder was given and ROFU_DATA_DIR / ../shared/data is absent.
    """
    if explicit is not None:
        path = Path(explicit)
    elif os.environ.get("ROFU_DATA_DIR"):
        path = Path(os.environ["ROFU_DATA_DIR"])
    else:
        path = ROOT.parent / "shared" / "data"
    if not path.is_dir():
        raise FileNotFoundError(
            f"benchmark data folder {path} not found: pass --data-dir or set ROFU_DATA_DIR"
        )
    return path
