"""Ollama's model management, translated: the names /api/pull reads, what /api/create gives the derived model
it makes, and the progress lines /api/pull writes. Pure: the routes (manage_routes.py) do the work."""

from __future__ import annotations

from typing import Any

from kinetic.chat import types as neutral
from kinetic.errors import InvalidRequestError
from kinetic.protocols.ollama.translate import runtime_options
from kinetic.protocols.ollama.types import CreateRequest

HF_HOSTS = ("hf.co/", "huggingface.co/")  # Ollama reads both as Hugging Face
DEFAULT_TAG = "latest"  # Ollama's; on Hugging Face it means the repo's default quant, as -hf without one


def model_name(name: str) -> str:
    """Ollama's names carry the tag `:latest` when none is given; kinetic keeps them without it."""
    return name.removesuffix(":" + DEFAULT_TAG)


def hf_repo(name: str) -> str:
    """`hf.co/OWNER/REPO:QUANT` (or `huggingface.co/...`, `https://hf.co/...`) -> `OWNER/REPO:QUANT`."""
    bare = name.split("://", 1)[1] if "://" in name else name
    host = next((h for h in HF_HOSTS if bare.lower().startswith(h)), None)
    if host is None:
        raise InvalidRequestError(f"pull model manifest: kinetic pulls from Hugging Face only: name the model "
                                  f"hf.co/OWNER/REPO[:QUANT], not {name!r}", param="model")
    repo, _, tag = bare[len(host):].partition(":")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise InvalidRequestError(f"invalid model name {name!r}: expected hf.co/OWNER/REPO[:QUANT]", param="model")
    return repo if not tag or tag == DEFAULT_TAG else f"{repo}:{tag}"


def _in_parameters(err: InvalidRequestError) -> InvalidRequestError:
    """runtime_options names `options.X`; /api/create's field is `parameters.X`."""
    param = (err.param or "").replace("options.", "parameters.", 1)
    return InvalidRequestError(err.message.replace("options.", "parameters.", 1), param=param or "parameters")


def check_create(body: CreateRequest) -> tuple[str, str]:
    """The new model's name and what it is made from; the fields kinetic cannot honour, a 400 naming them."""
    name = model_name(body.model or body.name or "")
    if not name:
        raise InvalidRequestError("model is required", param="model")
    for field, value in (("files", body.files), ("adapters", body.adapters), ("quantize", body.quantize)):
        if value:
            raise InvalidRequestError(f"{field}: kinetic makes a model only `from` one it serves; it does not "
                                      "read uploaded model files, adapters or quantize", param=field)
    if body.template:
        raise InvalidRequestError("template: a derived model renders its base model's chat template (Jinja, from "
                                  "the model file or --chat-template); Go templates are not read", param="template")
    if not body.from_:
        raise InvalidRequestError("from is required: the served model the new one is made from", param="from")
    return name, model_name(body.from_)


def create_fields(body: CreateRequest) -> tuple[str | None, tuple[tuple[str, str], ...] | None,
                                                 neutral.GenerationOptions | None]:
    """The system prompt, turns and options /api/create gives the new model (None: the base model's)."""
    options = None
    if body.parameters is not None:
        try:
            options = runtime_options(body.parameters)
        except InvalidRequestError as err:
            raise _in_parameters(err) from None
    messages = None
    if body.messages is not None:
        for index, message in enumerate(body.messages):
            if message.images or message.tool_calls:
                raise InvalidRequestError(f"messages[{index}]: a derived model's turns are text only",
                                          param=f"messages[{index}]")
        messages = tuple((m.role, m.content or "") for m in body.messages)
    return body.system, messages, options


def pull_line(filename: str, row: dict[str, int]) -> dict[str, Any]:
    """One file's progress, as Ollama's /api/pull writes a layer's."""
    return {"status": f"pulling {filename}", "total": row["total"], "completed": row["done"]}
