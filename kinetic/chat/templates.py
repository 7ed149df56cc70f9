"""Chat templates: choosing one, and rendering messages through it with Jinja.

The GGUF's own `tokenizer.chat_template` is used when present. A model without one gets the
built-in template of its architecture (Gemma's turn format for gemma*, chatml otherwise), where
llama-server would fall back to chatml for every model, markers Gemma's vocabulary lacks.

Templates see what llama-server gives them (common/chat.cpp): `strftime_now`, today's date as
`date_string` ("%d %b %Y", Llama 3.x) and `datetime` ("%b %d %Y", firefunction), `enable_thinking`
always (set by the chat layer), and llama.cpp's Jinja leniency of a missing or null value
concatenated with `+` to a string counting as "". `--chat-template NAME` also takes the names of
llama.cpp's own built-in formats (command-r, mistral-v7, phi4...), rendered by llama.cpp itself.
"""

from __future__ import annotations

import ctypes
import json
import operator
import os
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kinetic.chat.callformats.detect import detect_call_format
from kinetic.errors import InvalidRequestError

BUILTIN_NAMES = ("chatml", "gemma", "llama3")  # kinetic's Jinja built-ins (they render tools too)
REASONING_OPEN_TAGS = ("<think>", "<|START_THINKING|>")  # how a template's generation prompt opens reasoning
ARCHITECTURE_TEMPLATES = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "gemma3n": "gemma",
                          "gemma-embedding": "gemma"}


def builtin_template(name: str) -> str:
    return resources.files("kinetic.chat.template_files").joinpath(f"{name}.jinja").read_text(encoding="utf-8")


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    # HF templates expect tojson to keep non-ASCII text as is (Jinja's default escapes it).
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def _missing(value: Any) -> bool:
    return value is None or isinstance(value, jinja2.Undefined)


class _TemplateEnvironment(ImmutableSandboxedEnvironment):
    """Jinja as llama.cpp's engine runs chat templates: `"text" + missing` and `missing + "text"` are
    the text (firefunction-v2 adds an undefined `functions` to its system prompt; Python's Jinja
    would fail the whole request)."""

    intercepted_binops = frozenset(["+"])

    def call_binop(self, context: Context, operator_name: str, left: Any, right: Any) -> Any:
        if operator_name == "+":
            if _missing(left) and isinstance(right, str):
                return right
            if _missing(right) and isinstance(left, str):
                return left
            return operator.add(left, right)
        return super().call_binop(context, operator_name, left, right)


class _GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}` (Hugging Face's mark of the assistant's own text, for
    training masks; LFM2.5-8B-A1B's template uses it) renders its body as it is, as llama.cpp does."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _environment() -> ImmutableSandboxedEnvironment:
    env = _TemplateEnvironment(trim_blocks=True, lstrip_blocks=True,
                               extensions=["jinja2.ext.loopcontrols", _GenerationBlock])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def date_variables(now: datetime | None = None) -> dict[str, str]:
    """Today's date as llama-server hands it to every template (common_chat_extra_context)."""
    now = now or datetime.now()
    return {"datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y")}


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
        variables: dict[str, Any] = {**date_variables(), **(kwargs or {})}
        variables.update(messages=messages, add_generation_prompt=add_generation_prompt,
                         bos_token=self.bos_token, eos_token=self.eos_token)
        if tools:
            variables["tools"] = tools
        try:
            return self._compiled.render(**variables)  # type: ignore[attr-defined]  # set in __post_init__ (frozen)
        except jinja2.TemplateError as exc:
            raise InvalidRequestError(f"chat template error: {exc}", param="messages") from exc
        except (TypeError, AttributeError, KeyError, IndexError) as exc:
            raise InvalidRequestError(f"chat template could not render these messages: {exc}",
                                      param="messages") from exc

    @property
    def thinks(self) -> bool:
        return "<think>" in self.source

    @property
    def call_format(self) -> str:
        """The tool-call format the template speaks (kinetic.chat.callformats)."""
        return detect_call_format(self.source)

    @property
    def renders_tool_calls(self) -> bool:
        """Whether an assistant turn's `tool_calls` reach the prompt (llama.cpp's caps probe): LFM's
        templates print only `content`, so a past call must be written there."""
        cached = self.__dict__.get("_renders_tool_calls")
        if cached is None:
            cached = self._probe_tool_calls()
            object.__setattr__(self, "_renders_tool_calls", cached)
        return cached

    def _probe_tool_calls(self) -> bool:
        call = {"id": "call00001", "type": "function",
                "function": {"name": "kinetic_probe_tool", "arguments": {"arg": "kinetic_probe_value"}}}
        probe: list[dict[str, Any]] = [{"role": "user", "content": "User message"},
                                       {"role": "assistant", "content": "", "tool_calls": [call]},
                                       {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
                                       {"role": "user", "content": "User message"}]
        try:  # no tools listed, so the name can only come from the call
            return "kinetic_probe_tool" in self.render(probe, kwargs={"enable_thinking": False})
        except InvalidRequestError:
            return True  # a template that refuses the probe is left to render calls its own way

    @property
    def supports_thinking(self) -> bool:
        """Whether thinking can be switched: `enable_thinking` changes the generation prompt, or that
        prompt opens a reasoning block by itself (llama-server's supports_thinking, by probing)."""
        cached = self.__dict__.get("_supports_thinking")
        if cached is None:
            cached = self._probe_thinking()
            object.__setattr__(self, "_supports_thinking", cached)
        return cached

    def _probe_thinking(self) -> bool:
        probe = [{"role": "user", "content": "test"}]
        try:
            on = self.render(probe, kwargs={"enable_thinking": True})
            off = self.render(probe, kwargs={"enable_thinking": False})
        except InvalidRequestError:
            return False
        return on != off or any(tag in self.generation_prompt(probe, kwargs={"enable_thinking": True})
                                for tag in REASONING_OPEN_TAGS)

    def generation_prompt(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
                          kwargs: dict[str, Any] | None = None) -> str:
        """What `add_generation_prompt` adds after `messages` (llama.cpp's
        common_chat_template_generation_prompt: the two renders' difference after their common prefix)."""
        without = self.render(messages, add_generation_prompt=False, tools=tools, kwargs=kwargs)
        with_prompt = self.render(messages, add_generation_prompt=True, tools=tools, kwargs=kwargs)
        return with_prompt[len(os.path.commonprefix([without, with_prompt])):]


@cache
def llama_builtin_names() -> tuple[str, ...]:
    """The names of llama.cpp's own chat formats (llama_chat_builtin_templates)."""
    import llama_cpp  # the chat layer runs where llama_cpp is installed; imported late to keep startup light

    count = llama_cpp.llama_chat_builtin_templates(None, 0)
    names = (ctypes.c_char_p * count)()
    llama_cpp.llama_chat_builtin_templates(names, count)
    return tuple(name.decode("utf-8") for name in names if name)


@dataclass(frozen=True)
class LlamaBuiltinTemplate(ChatTemplate):
    """One of llama.cpp's built-in formats by name, rendered by llama.cpp (llama_chat_apply_template),
    as llama-server renders `--chat-template NAME`: roles and text only (no tools, no variables)."""

    def __post_init__(self) -> None:
        if self.source not in llama_builtin_names():
            raise ValueError(f"unknown chat template {self.source!r}")

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None, kwargs: dict[str, Any] | None = None) -> str:
        import llama_cpp

        roles = [str(m.get("role", "")).encode("utf-8") for m in messages]
        texts = [_text(m.get("content")).encode("utf-8") for m in messages]
        chat = (llama_cpp.llama_chat_message * len(messages))(
            *(llama_cpp.llama_chat_message(role=r, content=t) for r, t in zip(roles, texts, strict=True)))
        size = 2 * sum(len(r) + len(t) for r, t in zip(roles, texts, strict=True)) + 256
        for _ in range(2):  # the first call says how long the prompt is when the buffer was short
            buffer = ctypes.create_string_buffer(size)
            length = llama_cpp.llama_chat_apply_template(self.source.encode("utf-8"), chat, len(messages),
                                                         add_generation_prompt, buffer, size)
            if length < 0:
                raise InvalidRequestError(f"chat template {self.source!r} could not render these messages",
                                          param="messages")
            if length <= size:
                return buffer.raw[:length].decode("utf-8", errors="replace")
            size = length
        raise InvalidRequestError("chat template output did not fit", param="messages")

    @property
    def thinks(self) -> bool:
        return False

    @property
    def call_format(self) -> str:
        return "json"

    @property
    def renders_tool_calls(self) -> bool:
        return True  # llama.cpp's legacy renderer: roles and text only, as llama-server renders it

    @property
    def supports_thinking(self) -> bool:
        return False


def _text(content: Any) -> str:
    """Content as llama.cpp's legacy renderer reads it: text parts joined by newlines."""
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def choose_template(
    *,
    gguf_template: str | None,
    architecture: str,
    bos_token: str,
    eos_token: str,
    override: str | None = None,
    override_file: str | None = None,
) -> ChatTemplate:
    """Precedence: --chat-template-file, --chat-template (built-in name, llama.cpp format name or
    Jinja), the GGUF's template, then the built-in one for the architecture."""
    tokens = {"bos_token": bos_token, "eos_token": eos_token}
    if override_file:
        return ChatTemplate(Path(override_file).read_text(encoding="utf-8"), "--chat-template-file", **tokens)
    if override:
        if override in BUILTIN_NAMES:
            return ChatTemplate(builtin_template(override), f"builtin:{override}", **tokens)
        if "{%" in override or "{{" in override:
            return ChatTemplate(override, "--chat-template", **tokens)
        if override in llama_builtin_names():
            return LlamaBuiltinTemplate(override, f"llama.cpp:{override}", **tokens)
        raise ValueError(f"unknown chat template {override!r}: use one of {', '.join(known_names())} or Jinja text")
    if gguf_template:
        return ChatTemplate(gguf_template, "gguf", **tokens)
    name = ARCHITECTURE_TEMPLATES.get(architecture, "chatml")
    return ChatTemplate(builtin_template(name), f"builtin:{name}", **tokens)


def known_names() -> tuple[str, ...]:
    """Every name `--chat-template` takes: kinetic's Jinja built-ins, then llama.cpp's formats."""
    return BUILTIN_NAMES + tuple(n for n in llama_builtin_names() if n not in BUILTIN_NAMES)
