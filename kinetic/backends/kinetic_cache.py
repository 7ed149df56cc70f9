"""kinetic's own cache folder: the assembled bundled models, fetched projectors, the model files' digests."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The platform's user cache folder for kinetic; KINETIC_CACHE_DIR overrides it."""
    override = os.environ.get("KINETIC_CACHE_DIR")
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("kinetic"))
