"""--log-prompts-dir: each generation's prompt in a file of its own, named as llama-server names it (milliseconds
since the server started, 12 digits, .txt). For debugging a template: the file holds the prompt as the model
reads it."""

from __future__ import annotations

import logging
import time
from pathlib import Path

log = logging.getLogger(__name__)
STARTED = time.monotonic()  # ggml_time_ms()'s origin is the process's start too


def write_prompt(folder: str, text: str) -> Path | None:
    """The file written, or None (logged) when the folder cannot take it."""
    stamp = int((time.monotonic() - STARTED) * 1000)
    path = Path(folder).expanduser() / f"{stamp:012d}.txt"
    while path.exists():  # two prompts in one millisecond: the later one takes the next name
        stamp += 1
        path = path.with_name(f"{stamp:012d}.txt")
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        log.error("failed to create %s: %s", path, exc.strerror)
        return None
    return path
