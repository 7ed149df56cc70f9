"""Chat templates: choosing one, and rendering messages through it with Jinja.

The GGUF's own `tokenizer.chat_template` is used when present. A model without one gets the
built-in template of its architecture (Gemma's turn format for gemma*, chatml otherwise), where
llama-server would fall back to chatml for every model, markers Gemma's vocabulary lacks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kinetic.errors import InvalidRequestError

BUILTIN_NAMES = ("chatml", "gemma", "llama3")
ARCHITECTURE_TEMPLATES = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "gemma3n": "gemma",
                          "gemma-embedding": "gemma"}


def builtin_template(name: str) -> str:
    return resources.files("kinetic.templates").joinpath(f"{name}.jinja").read_text(encoding="utf-8")


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    # HF templates expect tojson to keep non-ASCII text as is (Jinja's default escapes it).
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja chat template plus where it came from (shown by /props)."""

    source: str
    origin: str  # "gguf", "builtin:<name>", "--chat-template", "--chat-template-file"
    bos_token: str = ""
    eos_token: str = ""

    def __post_init__(self) -> None:
        try:
            compiled = _environment().from_string(self.source)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"invalid chat template ({self.origin}): {exc}") from exc
        object.__setattr__(self, "_compiled", compiled)

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> str:
        variables: dict[str, Any] = dict(kwargs or {})
        variables.update(messages=messages, add_generation_prompt=add_generation_prompt,
                         bos_token=self.bos_token, eos_token=self.eos_token)
        if tools:
            variables["tools"] = tools
        try:
            return self._compiled.render(**variables)  # type: ignore[attr-defined]
        except jinja2.TemplateError as exc:
            raise InvalidRequestError(f"chat template error: {exc}", param="messages") from exc
        except (TypeError, AttributeError, KeyError, IndexError) as exc:
            raise InvalidRequestError(f"chat template could not render these messages: {exc}",
                                      param="messages") from exc

    @property
    def thinks(self) -> bool:
        return "<think>" in self.source


def choose_template(
    *,
    gguf_template: str | None,
    architecture: str,
    bos_token: str,
    eos_token: str,
    override: str | None = None,
    override_file: str | None = None,
) -> ChatTemplate:
    """Precedence: --chat-template-file, --chat-template (built-in name or Jinja), the GGUF's
    template, then the built-in one for the architecture."""
    tokens = {"bos_token": bos_token, "eos_token": eos_token}
    if override_file:
        return ChatTemplate(Path(override_file).read_text(encoding="utf-8"), "--chat-template-file", **tokens)
    if override:
        if override in BUILTIN_NAMES:
            return ChatTemplate(builtin_template(override), f"builtin:{override}", **tokens)
        if "{%" in override or "{{" in override:
            return ChatTemplate(override, "--chat-template", **tokens)
        raise ValueError(f"unknown chat template {override!r}: use one of {', '.join(BUILTIN_NAMES)} or Jinja text")
    if gguf_template:
        return ChatTemplate(gguf_template, "gguf", **tokens)
    name = ARCHITECTURE_TEMPLATES.get(architecture, "chatml")
    return ChatTemplate(builtin_template(name), f"builtin:{name}", **tokens)
