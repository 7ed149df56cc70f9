"""What every protocol adapter shares: the engine, the chat template, the served name and defaults.

Built once by the app's lifespan and kept on `app.state.service`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from kinetic import __version__
from kinetic.engine.chat import ChatTemplate, choose_template
from kinetic.engine.llama import LlamaEngine, ModelInfo
from kinetic.engine.types import SamplingParams
from kinetic.errors import InvalidRequestError
from kinetic.settings import ServerSettings


@dataclass(frozen=True)
class RenderedChat:
    prompt: str
    tokens: list[int]
    starts_in_reasoning: bool


@dataclass
class Service:
    settings: ServerSettings
    engine: LlamaEngine
    model_name: str
    aliases: tuple[str, ...]
    template: ChatTemplate | None = None
    default_template_kwargs: dict[str, Any] = field(default_factory=dict)
    started: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def create(cls, settings: ServerSettings, engine: LlamaEngine, resolved_name: str) -> "Service":
        aliases = tuple(sorted({a.strip() for a in (settings.alias or "").split(",") if a.strip()}))
        name = aliases[0] if aliases else resolved_name
        kwargs = json.loads(settings.chat_template_kwargs) if settings.chat_template_kwargs else {}
        return cls(settings=settings, engine=engine, model_name=name, aliases=aliases or (name,),
                   default_template_kwargs=kwargs)

    def on_model_loaded(self) -> None:
        info = self.info
        self.template = choose_template(
            gguf_template=info.chat_template if self.settings.jinja else None,
            architecture=info.architecture,
            bos_token=info.bos_token,
            eos_token=info.eos_token,
            override=self.settings.chat_template,
            override_file=self.settings.chat_template_file,
        )

    @property
    def ready(self) -> bool:
        """Model loaded and chat template chosen: only then may requests through."""
        return self.engine.ready and self.template is not None

    @property
    def info(self) -> ModelInfo:
        return self.engine.require_ready()

    @property
    def system_fingerprint(self) -> str:
        return f"b{__version__}-kinetic"

    def default_sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.settings.temp, seed=self.settings.seed)

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> RenderedChat:
        self.engine.require_ready()
        assert self.template is not None
        kwargs = {**self.default_template_kwargs, **(template_kwargs or {})}
        if "enable_thinking" in kwargs and not isinstance(kwargs["enable_thinking"], bool):
            got = type(kwargs["enable_thinking"]).__name__
            raise InvalidRequestError(f'invalid type for "enable_thinking" (expected boolean, got {got})',
                                      param="chat_template_kwargs")
        prompt = self.template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                      kwargs=kwargs)
        return RenderedChat(prompt=prompt, tokens=self.tokenize_prompt(prompt),
                            starts_in_reasoning=prompt.rstrip().endswith("<think>"))

    def tokenize_prompt(self, text: str) -> list[int]:
        """Tokens of a prompt with the model's BOS, never twice (templates often write it too)."""
        tokens = self.engine.tokenize(text, add_special=False, parse_special=True)
        bos = self.engine.model.token_bos()
        if self.info.add_bos and bos >= 0 and (not tokens or tokens[0] != bos):
            tokens.insert(0, bos)
        return tokens
