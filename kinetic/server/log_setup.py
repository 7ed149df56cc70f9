"""The log as llama-server's logging flags shape it, on Python's logging (the root logger main() set up).

-v and -lv set the threshold (llama.cpp's verbosity 1 error, 2 warning, 3 info, 4 and up debug; 0 leaves
only the lines kinetic prints itself: the start, the listening address, errors); --log-prefix starts each line
with its level and source, --log-timestamps with its time; --log-colors colours the level on a terminal;
--log-jsonl writes llama.cpp's JSON lines ({type, time, level, msg}) to stdout instead; --log-file copies the
log to a file; --log-disable silences it.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kinetic.config.settings import ServerSettings

LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"
# llama.cpp's verbosity threshold -> the lowest level that logs
VERBOSITY_LEVELS = {1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO}
COLOURS = {logging.DEBUG: "\033[33m", logging.INFO: "\033[32m", logging.WARNING: "\033[35m",
           logging.ERROR: "\033[31m", logging.CRITICAL: "\033[31m"}  # llama.cpp's: yellow, green, magenta, red
RESET = "\033[0m"
JSON_LEVELS = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn", logging.ERROR: "error",
               logging.CRITICAL: "error"}


def verbosity_level(verbosity: int) -> int:
    if verbosity <= 0:
        return logging.CRITICAL + 1
    return VERBOSITY_LEVELS.get(verbosity, logging.DEBUG)


class LineFormatter(logging.Formatter):
    """kinetic's line: [time] LEVEL source: message, the level coloured when asked."""

    def __init__(self, *, prefix: bool, timestamps: bool, colours: bool):
        fmt = ("%(asctime)s " if timestamps and prefix else "") + (LOG_FORMAT if prefix else "%(message)s")
        super().__init__(fmt)
        self.colours = colours and prefix

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        if not self.colours:
            return line
        colour = COLOURS.get(record.levelno, "")
        return line.replace(record.levelname, f"{colour}{record.levelname}{RESET}", 1)


class JsonLineFormatter(logging.Formatter):
    """llama.cpp's --log-jsonl object; `time` is microseconds since the start, 0 without --log-timestamps."""

    def __init__(self, *, timestamps: bool):
        super().__init__()
        self.timestamps = timestamps
        self.start = time.time()

    def format(self, record: logging.LogRecord) -> str:
        since = int((record.created - self.start) * 1e6) if self.timestamps else 0
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        return json.dumps({"type": "log", "time": max(since, 0), "level": JSON_LEVELS.get(record.levelno, "info"),
                           "msg": message}, ensure_ascii=False)


def _colours(setting: str, handler: logging.Handler) -> bool:
    if setting != "auto":
        return setting == "on"
    stream = getattr(handler, "stream", None)
    return bool(stream is not None and hasattr(stream, "isatty") and stream.isatty())


def configure_logging(settings: ServerSettings, root: logging.Logger | None = None) -> None:
    """The logging flags on the root logger (which main() set up with one stderr handler)."""
    root = root or logging.getLogger()
    root.setLevel(logging.DEBUG if settings.verbose else verbosity_level(settings.log_verbosity))
    if not settings.verbose:
        # huggingface_hub's HTTP client logs every request at INFO: noise around the download bar.
        for name in ("httpx", "httpx2"):
            logging.getLogger(name).setLevel(logging.WARNING)
    if settings.log_jsonl:  # llama.cpp writes JSON lines to stdout, all levels
        for to_stderr in [h for h in root.handlers if type(h) is logging.StreamHandler]:
            root.removeHandler(to_stderr)
        root.addHandler(logging.StreamHandler(sys.stdout))
    if settings.log_file:
        root.addHandler(logging.FileHandler(settings.log_file, encoding="utf-8"))
    for handler in root.handlers:
        if settings.log_jsonl:
            handler.setFormatter(JsonLineFormatter(timestamps=settings.log_timestamps))
        else:
            colours = not isinstance(handler, logging.FileHandler) and _colours(settings.log_colors, handler)
            handler.setFormatter(LineFormatter(prefix=settings.log_prefix, timestamps=settings.log_timestamps,
                                               colours=colours))
    if settings.log_prompts_dir:
        Path(settings.log_prompts_dir).expanduser().mkdir(parents=True, exist_ok=True)
    if settings.log_disable:
        root.setLevel(logging.CRITICAL + 1)  # nothing logs; the start and error lines still print
