"""Removing a downloaded model (DELETE /models, /api/delete): out of the router's list and out of the Hugging
Face cache, as llama-server's router removes one. Only a model of the cache goes: one a preset, --models-dir
or the command line names stays, and so does a cached file another model is served from."""

from __future__ import annotations

import anyio

from kinetic.errors import InvalidRequestError, NotFoundError
from kinetic.model_registry.downloads import remove_cached
from kinetic.model_registry.registry import ModelRegistry


async def remove_model(registry: ModelRegistry, name: str) -> None:
    """Cancels its download if one runs, else unloads and deletes it; `model_remove` on /models/sse."""
    if await registry.downloads.cancel(name):  # llama-server: removing a download cancels it
        await anyio.to_thread.run_sync(remove_cached, name)
        registry.events.publish(name, "model_remove", {})
        return
    entry = registry.find(name)
    if entry is not None and entry.spec.source != "cache":
        raise InvalidRequestError(f"model name={name} is not removable (not from cache)", param="model")
    repo = entry.spec.hf_repo if entry is not None and entry.spec.hf_repo else name
    holders = [e.name for e in registry.entries.values() if e is not entry and e.spec.hf_repo == repo]
    if holders:
        raise InvalidRequestError(f"model name={name} is not removable: model {holders[0]} is served from the "
                                  "same files", param="model")
    if entry is not None:
        await registry.remove(entry)
    # a model of the cache this router does not list goes too: llama-server's router lists the whole cache
    if not await anyio.to_thread.run_sync(remove_cached, repo) and entry is None:
        raise NotFoundError(f"model name={name} is not found", param="model")
    registry.events.publish(entry.name if entry is not None else name, "model_remove", {})
