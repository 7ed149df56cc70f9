"""The body of GET /v1/models and /models: llama-server's list, with each model's state in router mode."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kinetic.backends.gguf_files import projector_inputs
from kinetic.config.settings import ServerSettings
from kinetic.model_registry.derived import DerivedModel
from kinetic.model_registry.downloads import Download
from kinetic.model_registry.factory import finds_projector
from kinetic.model_registry.registry import ModelEntry, ModelRegistry
from kinetic.model_registry.served import Served


def model_entry(served: Served) -> dict[str, Any]:
    """A loaded model, as llama-server's single-model /v1/models shows it (a remote one has no `meta`:
    its file is the other server's)."""
    described = served.describe()
    body: dict[str, Any] = {
        "id": served.name,
        "aliases": list(served.aliases),
        "tags": list(served.backend.config.switches.tags),
        "object": "model",
        "created": int(time.time()),
        "owned_by": "llamacpp",
    }
    info = described.info
    if info is not None:
        body["meta"] = {"vocab_type": info.vocab_type, "n_vocab": info.n_vocab, "n_ctx": described.n_ctx,
                        "n_ctx_train": info.n_ctx_train, "n_embd": info.n_embd, "n_params": info.n_params,
                        "size": info.size, "ftype": info.ftype}
    # llama-server's: clients check it before they send media
    multimodal = described.modalities.vision or described.modalities.audio
    body["capabilities"] = ["completion", "multimodal"] if multimodal else ["completion"]
    return body


def input_modalities(entry: ModelEntry, settings: ServerSettings) -> list[str]:
    """A loaded model's, else what its projector file says it reads (llama-server's router lists them
    before a load)."""
    backend = entry.backend
    if backend is not None and backend.ready:
        modalities = backend.describe().modalities
        vision, audio = modalities.vision, modalities.audio
    else:
        projector = entry.spec.mmproj if finds_projector(entry.spec.settings or settings) else None
        vision, audio = projector_inputs(projector) if projector is not None else (False, False)
    return ["text"] + ["image"] * vision + ["audio"] * audio


def capabilities(entry: ModelEntry, settings: ServerSettings) -> list[str]:
    """The `models` rows' capabilities: an embedding model's, else completion and (with a projector) multimodal."""
    if output_modalities(entry) == ["embedding"]:
        return ["embedding"]
    return ["completion", "multimodal"] if input_modalities(entry, settings) != ["text"] else ["completion"]


def ollama_shaped(name: str, capabilities: list[str]) -> dict[str, Any]:
    """The `models` array llama-server keeps for Ollama clients."""
    return {"name": name, "model": name, "modified_at": "", "size": "", "digest": "", "type": "model",
            "description": "", "tags": [""], "capabilities": capabilities, "parameters": "",
            "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                        "parameter_size": "", "quantization_level": ""}}


def router_entry(entry: ModelEntry, settings: ServerSettings, *, admin: bool = True) -> dict[str, Any]:
    """A router's model in any state (llama-server's router /models row); an upstream model's servers
    for the admin."""
    spec = entry.spec
    backend = entry.backend
    body: dict[str, Any] = model_entry(Served(backend)) if backend is not None and backend.ready else {
        "id": spec.name, "aliases": list(spec.aliases), "tags": [], "object": "model",
        "created": int(time.time()), "owned_by": "llamacpp"}
    status: dict[str, Any] = {"value": "sleeping" if entry.sleeping else entry.state.value, "args": []}
    if entry.failure:
        status.update(failed=True, message=entry.failure)
    body["status"] = status
    body["architecture"] = {"input_modalities": input_modalities(entry, settings),
                            "output_modalities": output_modalities(entry)}
    body["source"] = spec.source
    body["can_remove"] = spec.source == "cache"  # downloaded here (POST /models): DELETE /models removes it
    if spec.remote:
        body["owned_by"] = "upstream"
        if backend is not None and admin:
            status["upstreams"] = backend.describe().members
    return body


def output_modalities(entry: ModelEntry) -> list[str]:
    backend = entry.backend
    if backend is not None and backend.ready and not backend.capabilities.generate:
        return ["embedding"]
    return ["text"]


def derived_entry(model: DerivedModel, base: ModelEntry, settings: ServerSettings) -> dict[str, Any]:
    """A derived model (/api/create's) in a router's list: its base model's row, under its own name."""
    backend = base.backend
    body = router_entry(base, settings)
    if backend is not None and backend.ready:
        body.update(model_entry(Served(backend, model)))
    body.update(id=model.name, aliases=[model.name], source="derived", can_remove=True)
    body["parent_model"] = model.base
    return body


def downloading_entry(download: Download) -> dict[str, Any]:
    """A model being downloaded (POST /models), as llama-server's router lists it."""
    return {"id": download.name, "aliases": list(download.aliases), "tags": [], "object": "model",
            "created": int(time.time()), "owned_by": "llamacpp",
            "status": {"value": "downloading", "progress": {url: dict(row) for url, row in download.progress.items()}},
            "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
            "source": "cache", "can_remove": True}


def derived_models(registry: ModelRegistry) -> list[tuple[DerivedModel, ModelEntry]]:
    return [(m, base) for m in registry.derived.values() if (base := registry.find(m.base)) is not None]


def models_body(registry: ModelRegistry, allows: Callable[[tuple[str, ...]], bool] = lambda names: True,
                *, admin: bool = True) -> dict[str, Any]:
    """The models listed; `allows` (by a model's id and aliases) hides those the caller's key may not use."""
    derived = [(m, base) for m, base in derived_models(registry) if allows((m.name,)) and allows(base.spec.names)]
    if not registry.router:
        backend = registry.only.backend
        assert backend is not None
        served = [Served(backend)] if allows(registry.only.spec.names) else []
        served += [Served(backend, m) for m, _ in derived]
        rows = [model_entry(s) for s in served]
        return {"models": [ollama_shaped(row["id"], row["capabilities"]) for row in rows], "object": "list",
                "data": rows}
    settings = registry.settings
    # a cache entry a preset stands for (dedup-cache-models) answers by name but is not listed
    entries = [entry for entry in registry.entries.values() if allows(entry.spec.names) and not entry.spec.hidden]
    return {"models": [ollama_shaped(e.name, capabilities(e, settings)) for e in entries]
            + [ollama_shaped(m.name, capabilities(b, settings)) for m, b in derived],
            "object": "list",
            "data": [router_entry(e, settings, admin=admin) for e in entries]
            + [derived_entry(m, b, settings) for m, b in derived]
            + [downloading_entry(d) for d in registry.downloads.active.values()]}
