"""The body of GET /v1/models and /models: llama-server's list, with each model's state in router mode."""

from __future__ import annotations

import time
from typing import Any

from kinetic.router.registry import ModelEntry, ModelRegistry
from kinetic.service import Service


def model_entry(service: Service) -> dict[str, Any]:
    """A loaded model, as llama-server's single-model /v1/models shows it."""
    info = service.info
    return {
        "id": service.model_name,
        "aliases": list(service.aliases),
        "tags": tags(service.settings.tags),
        "object": "model",
        "created": int(time.time()),
        "owned_by": "llamacpp",
        "meta": {"vocab_type": info.vocab_type, "n_vocab": info.n_vocab, "n_ctx": service.engine.slot_n_ctx,
                 "n_ctx_train": info.n_ctx_train, "n_embd": info.n_embd, "n_params": info.n_params,
                 "size": info.size, "ftype": info.ftype},
    }


def tags(value: str | None) -> list[str]:
    """--tags a,b: sorted and without duplicates, as llama-server keeps them (a std::set)."""
    return sorted({t.strip() for t in (value or "").split(",") if t.strip()})


def ollama_shaped(name: str, capabilities: list[str]) -> dict[str, Any]:
    """The `models` array llama-server keeps for Ollama clients."""
    return {"name": name, "model": name, "modified_at": "", "size": "", "digest": "", "type": "model",
            "description": "", "tags": [""], "capabilities": capabilities, "parameters": "",
            "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                        "parameter_size": "", "quantization_level": ""}}


def router_entry(entry: ModelEntry) -> dict[str, Any]:
    """A router's model in any state (llama-server's router /models row)."""
    spec = entry.spec
    service = entry.service
    body: dict[str, Any] = model_entry(service) if service is not None and service.ready else {
        "id": spec.name, "aliases": list(spec.aliases), "tags": [], "object": "model",
        "created": int(time.time()), "owned_by": "llamacpp"}
    status: dict[str, Any] = {"value": "sleeping" if entry.sleeping else entry.state.value, "args": []}
    if entry.failure:
        status.update(failed=True, message=entry.failure)
    body["status"] = status
    body["architecture"] = {"input_modalities": ["text"], "output_modalities": capabilities(entry)}
    body["source"] = spec.source
    body["can_remove"] = False
    if spec.remote:
        body["owned_by"] = "upstream"
        upstream_status = getattr(service, "upstream_status", None)  # an UpstreamService's pool
        if upstream_status is not None:
            status["upstreams"] = upstream_status()
    return body


def capabilities(entry: ModelEntry) -> list[str]:
    service = entry.service
    if service is not None and service.ready and not service.engine.can_generate:
        return ["embedding"]
    return ["text"]


def models_body(registry: ModelRegistry) -> dict[str, Any]:
    if not registry.router:
        service = registry.only.service
        assert service is not None
        return {"models": [ollama_shaped(service.model_name, ["completion"])], "object": "list",
                "data": [model_entry(service)]}
    entries = list(registry.entries.values())
    return {"models": [ollama_shaped(e.name, ["embedding"] if capabilities(e) == ["embedding"] else ["completion"])
                       for e in entries],
            "object": "list", "data": [router_entry(e) for e in entries]}
