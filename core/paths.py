"""Where SpecLens keeps the user's data: one definition for the app (history, settings) and core (memory)."""
from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "SPECLENS_DATA_DIR"


def data_dir() -> Path:
    """The user data folder: ``SPECLENS_DATA_DIR`` when set, else platformdirs' user data folder (not created)."""
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override)
    from platformdirs import user_data_dir

    return Path(user_data_dir("speclens"))
