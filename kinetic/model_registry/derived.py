"""Derived models: a served model under another name, with a system prompt, earlier turns, sampler
defaults and a chat template of its own (Ollama's /api/create `from` + `system`/`messages`/`parameters`/
`template`, and /api/copy).

An instructor makes a "lab tutor" from the class model with the lab's instructions baked in; every
protocol then serves it by name, through the base model's backend (derived_backend.py): no second copy of
the weights, no second engine. Each one is a small JSON file in `derived-models/` beside the models
(the --models-dir folder, else kinetic's cache, where the bundled model is), so it survives a restart.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

from kinetic.backends.kinetic_cache import cache_dir
from kinetic.chat.types import SAMPLER_FIELDS, GenerationOptions, SamplingOptions
from kinetic.classroom.durable import write_whole

log = logging.getLogger(__name__)

FOLDER = "derived-models"
FORMAT = 1  # the file's layout; a file of another one is skipped with a warning


@dataclass(frozen=True)
class DerivedModel:
    name: str
    base: str  # a model of the registry (never another derived one: `from` a derived model copies it)
    system: str | None = None
    messages: tuple[tuple[str, str], ...] = ()  # (role, text) turns that come before the request's own
    options: GenerationOptions = field(default_factory=GenerationOptions)
    created: float = 0.0  # seconds since the epoch
    template: str | None = None  # Jinja chat template rendered instead of the base model's (None: the base's)

    def renamed(self, name: str) -> DerivedModel:
        return replace(self, name=name)

    def derive(self, name: str, *, system: str | None, messages: tuple[tuple[str, str], ...] | None,
               options: GenerationOptions | None, created: float, template: str | None = None) -> DerivedModel:
        """A model made from this one (/api/create `from` it): what is given replaces its own, and given
        options go over its own, field by field."""
        return DerivedModel(name=name, base=self.base, system=self.system if system is None else system,
                            messages=self.messages if messages is None else messages,
                            options=self.options if options is None else with_defaults(options, self.options),
                            created=created, template=self.template if template is None else template)

    def to_json(self) -> dict[str, Any]:
        sampling = {k: v for k, v in self.options.sampling.chosen.items() if v is not None}
        options: dict[str, Any] = {"sampling": sampling, "stop": list(self.options.stop)}
        if self.options.max_tokens is not None:
            options["max_tokens"] = self.options.max_tokens
        if self.options.context_limit is not None:
            options["context_limit"] = self.options.context_limit
        return {"format": FORMAT, "name": self.name, "from": self.base, "system": self.system,
                "messages": [{"role": role, "content": text} for role, text in self.messages],
                "options": options, "created": self.created, "template": self.template}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DerivedModel:
        options = data.get("options") or {}
        sampling = {k: v for k, v in (options.get("sampling") or {}).items() if k in SAMPLER_FIELDS}
        if isinstance(sampling.get("dry_sequence_breakers"), list):
            sampling["dry_sequence_breakers"] = tuple(sampling["dry_sequence_breakers"])
        return cls(name=str(data["name"]), base=str(data["from"]), system=data.get("system"),
                   messages=tuple((str(m["role"]), str(m["content"])) for m in data.get("messages") or ()),
                   options=GenerationOptions(sampling=SamplingOptions(chosen=sampling),
                                             max_tokens=options.get("max_tokens"),
                                             stop=tuple(options.get("stop") or ()),
                                             context_limit=options.get("context_limit")),
                   created=float(data.get("created") or 0.0), template=data.get("template"))


def with_defaults(asked: GenerationOptions, defaults: GenerationOptions) -> GenerationOptions:
    """The request's options, each field it left unset taken from the derived model's."""
    sampling = SamplingOptions(chosen={**defaults.sampling.chosen, **asked.sampling.chosen},
                               logit_bias=asked.sampling.logit_bias if asked.sampling.logit_bias is not None
                               else defaults.sampling.logit_bias)
    return replace(asked, sampling=sampling,
                   max_tokens=asked.max_tokens if asked.max_tokens is not None else defaults.max_tokens,
                   stop=asked.stop or defaults.stop,
                   context_limit=asked.context_limit if asked.context_limit is not None else defaults.context_limit)


class DerivedStore:
    """The derived models of one server, read at start and written on every change."""

    def __init__(self, folder: Path | None):
        self.folder = folder  # None: kept in memory only (a test's registry)

    def _path(self, name: str) -> Path:
        assert self.folder is not None
        return self.folder / (quote(name, safe="") + ".json")  # names hold '/' and ':'

    def load(self) -> list[DerivedModel]:
        if self.folder is None or not self.folder.is_dir():
            return []
        found = []
        for path in sorted(self.folder.glob("*.json")):
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                if data.get("format") != FORMAT:
                    raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}")
                found.append(DerivedModel.from_json(data))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("derived model file %s skipped: %s", path, exc)
        return found

    def save(self, model: DerivedModel) -> None:
        if self.folder is None:
            return
        write_whole(self._path(model.name), json.dumps(model.to_json(), indent=1).encode(),
                    what=f"the model {model.name!r}")  # a crash leaves the old file or the new, whole

    def remove(self, name: str) -> None:
        if self.folder is not None:
            self._path(name).unlink(missing_ok=True)


def store_folder(models_dir: str | None) -> Path:
    """Beside the models: the --models-dir folder, else kinetic's cache (the bundled model's)."""
    root = Path(models_dir).expanduser() if models_dir else cache_dir() / "models"
    return root / FOLDER
