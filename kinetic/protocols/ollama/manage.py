"""Ollama's model management, translated: the names /api/pull reads, what /api/create gives the derived model
it makes, and the progress lines /api/pull writes. Pure: the routes (manage_routes.py) do the work."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from kinetic.chat import types as neutral
from kinetic.chat.templates import ChatTemplate
from kinetic.errors import InvalidRequestError
from kinetic.protocols.ollama.translate import runtime_options
from kinetic.protocols.ollama.types import CreateRequest

HF_HOSTS = ("hf.co/", "huggingface.co/")  # Ollama reads both as Hugging Face
DEFAULT_TAG = "latest"  # Ollama's; on Hugging Face it means the repo's default quant, as -hf without one
# An action of Go's text/template, as Ollama's TEMPLATEs are written ({{ .Prompt }}, {{- range .Messages }},
# {{ if .System }}, {{ end }}, $.Tools): in Jinja each of these is a syntax error or means something else.
GO_ACTION = re.compile(r"\{\{-?\s*(?:\.[A-Za-z]|\$|(?:if|range|end|else|with|define|template|block)\b)")


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
    if not body.from_:
        raise InvalidRequestError("from is required: the served model the new one is made from", param="from")
    return name, model_name(body.from_)


def chat_template(body: CreateRequest) -> str | None:
    """The Jinja chat template the new model renders (None: its base model's). Ollama's own templates are Go
    templates over .Prompt/.Messages: kinetic renders chats with Jinja only, as llama-server does, so one of
    those is a 400 that says what to send instead."""
    if not body.template:
        return None
    if GO_ACTION.search(body.template):
        raise InvalidRequestError("template: this is a Go template (Ollama's {{ .Prompt }} / {{ range .Messages }} "
                                  "syntax); kinetic renders chat templates with Jinja, as llama-server does: send "
                                  "a Jinja template over `messages` (as the model's tokenizer.chat_template), or "
                                  "leave template out to keep the base model's", param="template")
    try:
        ChatTemplate(body.template, "/api/create")
    except ValueError as err:
        raise InvalidRequestError(f"template: {err}", param="template") from None
    return body.template


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


def pulled_lines(files: list[Path]) -> list[dict[str, Any]]:
    """The whole of a pull of a model kinetic already has, as Ollama answers one: every file complete at once."""
    lines: list[dict[str, Any]] = [{"status": "pulling manifest"}]
    for file in files:
        size = file.stat().st_size
        lines.append(pull_line(file.name, {"total": size, "done": size}))
    return [*lines, {"status": "verifying sha256 digest"}, {"status": "writing manifest"}, {"status": "success"}]


def pull_line(filename: str, row: dict[str, int]) -> dict[str, Any]:
    """One file's progress, as Ollama's /api/pull writes a layer's."""
    return {"status": f"pulling {filename}", "total": row["total"], "completed": row["done"]}
