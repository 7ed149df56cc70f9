"""Ollama's view of the served model: /api/tags, /api/ps and /api/show entries, and the model name check.

Pure: the routes pass in what the server knows (`ServedModel`, `ModelFile`, the engine's `ModelInfo`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from kinetic.engine.types import ModelInfo
from kinetic.errors import InvalidRequestError, NotFoundError

# What /api/version reports: recent enough that clients gating thinking or structured outputs on
# the version enable them.
OLLAMA_VERSION = "0.12.0"
# kinetic never unloads its model: /api/ps shows a far-future expiry, as Ollama does for keep_alive < 0.
NEVER_EXPIRES = "2099-01-01T00:00:00Z"
# llama.cpp's general.file_type numbers, named as Ollama names them in details.quantization_level.
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
              11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
              18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
              25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
              32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4"}


def timestamp(seconds: float | None = None) -> str:
    """RFC 3339 in UTC with a Z, as Ollama writes `created_at` and `modified_at`."""
    moment = datetime.now(UTC) if seconds is None else datetime.fromtimestamp(seconds, UTC)
    return moment.isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class ServedModel:
    """What the translation needs to know about the model behind the routes."""

    name: str
    aliases: tuple[str, ...]
    thinks: bool  # the chat template has a reasoning block
    n_ctx: int  # one slot's context, the most a request can use
    embeddings: bool = False
    generates: bool = True  # False: an embedding-only model (router mode)
    vision: bool = False  # its projector reads images (Ollama's "vision" capability)


class ModelFile(Protocol):
    """The served GGUF as /api/tags shows it (kinetic.backends.model_file.ModelFile, read off the event loop)."""

    @property
    def sha256(self) -> str: ...

    @property
    def size(self) -> int: ...

    @property
    def modified(self) -> float: ...  # seconds since the epoch


def check_model(requested: str, served: ServedModel) -> None:
    """The served model, one of its aliases, or either with Ollama's default `:latest` tag."""
    if not requested:
        raise InvalidRequestError("model is required", param="model")
    names = {served.name, *served.aliases}
    if requested in names or requested.removesuffix(":latest") in names or f"{requested}:latest" in names:
        return
    raise NotFoundError(f'model "{requested}" not found', param="model")


def human_number(n: int) -> str:
    """Ollama's parameter_size: 268098176 -> "268.10M", 8030261248 -> "8.0B", 7000000000 -> "7B"."""
    for scale, suffix, digits in ((1e9, "B", 1), (1e6, "M", 2)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f}{suffix}" if value == math.floor(value) else f"{value:.{digits}f}{suffix}"
    return f"{n / 1e3:.0f}K" if n >= 1000 else str(n)


def quantization_level(info: ModelInfo) -> str:
    file_type = info.metadata.get("general.file_type", "")
    if file_type.isdigit() and int(file_type) in FILE_TYPES:
        return FILE_TYPES[int(file_type)]
    # llama.cpp's description says "Q4_K - Medium": Ollama writes Q4_K_M
    return info.ftype.replace(" - Medium", "_M").replace(" - Small", "_S").replace(" - Large", "_L").replace(" ", "_")


def details(info: ModelInfo) -> dict[str, Any]:
    return {"parent_model": "", "format": "gguf", "family": info.architecture, "families": [info.architecture],
            "parameter_size": human_number(info.n_params), "quantization_level": quantization_level(info)}


def capabilities(served: ServedModel) -> list[str]:
    if not served.generates:
        return ["embedding"]
    found = ["completion", "tools"]
    if served.thinks:
        found.append("thinking")
    if served.vision:
        found.append("vision")
    if served.embeddings:
        found.append("embedding")
    return found


def model_entry(served: ServedModel, info: ModelInfo, file: ModelFile) -> dict[str, Any]:
    """One model of /api/tags. Open WebUI reads both `name` and `model`."""
    return {"name": served.name, "model": served.name, "modified_at": timestamp(file.modified), "size": file.size,
            "digest": file.sha256, "details": details(info), "capabilities": capabilities(served)}


def tags(served: ServedModel, info: ModelInfo, file: ModelFile) -> dict[str, Any]:
    return {"models": [model_entry(served, info, file)]}


def unloaded_entry(name: str) -> dict[str, Any]:
    """A router's model that is not loaded: /api/tags lists it by name (its facts come with loading)."""
    return {"name": name, "model": name, "modified_at": timestamp(0), "size": 0, "digest": "",
            "details": {"parent_model": "", "format": "gguf", "family": "", "families": [], "parameter_size": "",
                        "quantization_level": ""}, "capabilities": []}


def ps_entry(served: ServedModel, info: ModelInfo, file: ModelFile) -> dict[str, Any]:
    entry = {key: value for key, value in model_entry(served, info, file).items()
             if key not in ("modified_at", "capabilities")}
    return {**entry, "expires_at": NEVER_EXPIRES, "size_vram": 0, "context_length": served.n_ctx}


def ps(served: ServedModel, info: ModelInfo, file: ModelFile) -> dict[str, Any]:
    return {"models": [ps_entry(served, info, file)]}


def _metadata_value(text: str) -> Any:
    """GGUF metadata arrives as text: numbers become numbers again, as Ollama's model_info has them."""
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text


def show(served: ServedModel, info: ModelInfo, file: ModelFile, *, template: str, stop: tuple[str, ...],
         temperature: float) -> dict[str, Any]:
    model_info = {key: _metadata_value(value) for key, value in sorted(info.metadata.items())
                  if key != "tokenizer.chat_template"}
    arch = info.architecture
    model_info.update({"general.architecture": arch, "general.parameter_count": info.n_params,
                       f"{arch}.context_length": info.n_ctx_train, f"{arch}.embedding_length": info.n_embd})
    # Continue reads num_ctx and JSON-decodes each stop value: "key   value" lines, stops quoted.
    lines = [f"{'num_ctx':<30} {served.n_ctx}", f"{'temperature':<30} {temperature:g}"]
    lines += [f"{'stop':<30} {json.dumps(s, ensure_ascii=False)}" for s in stop if s]
    parameters = "\n".join(lines)
    modelfile = (f"# Modelfile generated by kinetic\nFROM {info.path}\n"
                 + "".join(f"PARAMETER {line}\n" for line in lines))
    return {"license": info.metadata.get("general.license", ""), "modelfile": modelfile, "parameters": parameters,
            "template": template, "details": details(info), "model_info": model_info,
            "capabilities": capabilities(served), "modified_at": timestamp(file.modified)}
