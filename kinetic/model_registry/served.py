"""A request's model as it is served: the backend of the model it names, and, for a derived model, how each of
its requests is dressed before that backend sees it.

A derived model is no backend of its own: the registry hands its requests the base model's backend, with the
derived model to dress them by (`Served`). Dressing is Ollama's: the derived system prompt stands where the
request has none (a request's own system message replaces it), the derived turns go before the request's, a
sampler field the request leaves unset takes the derived value, then the server's, and a derived template is
rendered instead of the base model's (`ChatRequest.template`: only a backend with the Templating role can). A
raw prompt (/completion, /v1/completions, /api/generate `raw`) or an infill gets the sampler defaults only: it
has no turns to add to.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TypeVar

from kinetic.backends.base import Description, ModelBackend, Templating, role
from kinetic.chat.types import ChatRequest, InfillRequest, Message, PromptRequest, TextPart
from kinetic.model_registry.derived import DerivedModel, with_defaults

R = TypeVar("R")


def dressed(req: ChatRequest, model: DerivedModel) -> ChatRequest:
    """A chat request as the derived model answers it: its system prompt where the request has none, its
    turns after the request's system messages and before the rest, its options under the request's, its
    template instead of the model's."""
    system_roles = ("system", "developer")
    leading = tuple(m for m in req.messages if m.role in system_roles)
    rest = tuple(m for m in req.messages if m.role not in system_roles)
    system = (Message(role="system", parts=(TextPart(model.system),)),) if model.system and not leading else ()
    turns = tuple(Message(role=role, parts=(TextPart(text),)) for role, text in model.messages)
    return replace(req, messages=system + leading + turns + rest, options=with_defaults(req.options, model.options),
                   template=model.template if req.template is None else req.template)


@dataclass(frozen=True)
class Served:
    """The model a request names: the backend that serves it and the derived model it is served as (None: the
    model itself). A route names the model by `name`, asks for the backend's roles through `role` (the shared
    501 names the model as the request did), and dresses each request before a role prepares it."""

    backend: ModelBackend
    derived: DerivedModel | None = None

    @classmethod
    def as_derived(cls, backend: ModelBackend, derived: DerivedModel) -> Served:
        """The base model's backend dressed as `derived`; a derived template needs the base's Templating role."""
        if derived.template is not None:
            role(backend, Templating, name=backend.name, route="a derived model's own chat template")
        return cls(backend, derived)

    @property
    def name(self) -> str:
        return self.backend.name if self.derived is None else self.derived.name

    @property
    def aliases(self) -> tuple[str, ...]:
        return self.backend.aliases if self.derived is None else (self.derived.name,)

    def describe(self) -> Description:
        """The backend's description, under the derived model's name and with its template."""
        described = self.backend.describe()
        if self.derived is None:
            return described
        template = described.template
        if self.derived.template is not None and isinstance(self.backend, Templating):
            template = self.backend.chat_template(self.derived.template)
        return replace(described, name=self.name, aliases=self.aliases, template=template)

    def role(self, wanted: type[R], route: str) -> R:
        """The backend as the role `route` needs, or the 501 naming the model and the route (backends/base.py)."""
        return role(self.backend, wanted, name=self.name, route=route)

    # ------------------------------------------------------------------ the requests, dressed

    def chat(self, req: ChatRequest) -> ChatRequest:
        return req if self.derived is None else dressed(req, self.derived)

    def prompt(self, req: PromptRequest) -> PromptRequest:
        return req if self.derived is None else replace(req, options=with_defaults(req.options, self.derived.options))

    def infill(self, req: InfillRequest) -> InfillRequest:
        return req if self.derived is None else replace(req, options=with_defaults(req.options, self.derived.options))

    def messages(self, messages: tuple[Message, ...]) -> tuple[Message, ...]:
        """A chat's messages as the derived model renders them (/apply-template): its system prompt and turns."""
        return messages if self.derived is None else dressed(ChatRequest(messages=messages), self.derived).messages

    @property
    def template(self) -> str | None:
        """The derived model's own chat template (its Jinja source); None: the model's."""
        return None if self.derived is None else self.derived.template
