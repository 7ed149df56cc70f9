"""llama-server's router routes that add and remove models: POST /models (a download from Hugging Face,
model_registry/downloads.py) and DELETE /models?model= (a downloaded model out of the cache). Admin only
(classroom/roles.py); like llama-server's, they exist in router mode only."""

from __future__ import annotations

from fastapi import APIRouter

from kinetic.errors import InvalidRequestError, NotFoundError
from kinetic.model_registry.deps import RegistryDep
from kinetic.model_registry.registry import ModelRegistry
from kinetic.model_registry.removal import remove_model
from kinetic.protocols.llamacpp.types import ModelActionRequest

router = APIRouter()


def require_router(registry: ModelRegistry) -> None:
    if not registry.router:
        raise NotFoundError("File Not Found")


@router.post("/models")
async def download_model(body: ModelActionRequest, registry: RegistryDep) -> dict[str, bool]:
    """Starts the download and answers at once; /models/sse tells how it goes."""
    require_router(registry)
    if not body.model:
        raise InvalidRequestError("model must be a non-empty string", param="model")
    await registry.download(body.model)
    return {"success": True}


@router.delete("/models")
async def delete_model(registry: RegistryDep, model: str = "") -> dict[str, bool]:
    require_router(registry)
    if not model:
        raise InvalidRequestError("model must be a non-empty string", param="model")
    await remove_model(registry, model)
    return {"success": True}
