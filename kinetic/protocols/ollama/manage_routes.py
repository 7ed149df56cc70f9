"""Ollama's model management routes: /api/pull, /api/create, /api/copy, /api/delete and /api/push. Admin only
(classroom/roles.py). A pull is a router's download from Hugging Face (model_registry/downloads.py); create
and copy make derived models (model_registry/derived.py), which every protocol then serves by name."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kinetic.errors import InvalidRequestError, NotFoundError, NotSupportedError, ServerError
from kinetic.model_registry.deps import RegistryDep
from kinetic.model_registry.derived import DerivedModel
from kinetic.model_registry.downloads import Download
from kinetic.model_registry.registry import ModelNotFoundError, ModelRegistry
from kinetic.model_registry.removal import remove_model
from kinetic.protocols.ollama import manage
from kinetic.protocols.ollama.names import check_name
from kinetic.protocols.ollama.types import CopyRequest, CreateRequest, DeleteRequest, PullRequest

router = APIRouter()
NDJSON = "application/x-ndjson"


def known_or_valid(registry: ModelRegistry, name: str, field: str) -> str:
    """A name that refers to a model: one kinetic serves passes as it is (its names come from files and -a,
    which Ollama's grammar does not bind); any other is held to the grammar, as Ollama holds it."""
    if registry.find(name) is None and registry.derived_model(name) is None:
        check_name(name, field)
    return name


def _line(body: dict[str, Any]) -> bytes:
    return (json.dumps(body, separators=(",", ":")) + "\n").encode()


def _lines(bodies: list[dict[str, Any]], stream: bool | None) -> Response:
    """Ollama streams a status line per step unless `stream` is false; then only the last is sent."""
    if stream is False:
        return JSONResponse(bodies[-1])
    return Response(b"".join(_line(b) for b in bodies), media_type=NDJSON)


async def _pull_progress(download: Download, events: AsyncGenerator[dict[str, Any], None]) -> AsyncIterator[bytes]:
    names = {download.url(f): f for f in download.files}
    yield _line({"status": "pulling manifest"})
    try:
        async for event in events:
            if event["model"] != download.name:
                continue
            if event["event"] == "download_progress":
                for url, row in event["data"]["progress"].items():
                    yield _line(manage.pull_line(names.get(url, url), row))
            elif event["event"] == "download_finished":
                for status in ("verifying sha256 digest", "writing manifest", "success"):
                    yield _line({"status": status})
                return
            elif event["event"] == "download_failed":
                yield _line({"error": f"pull model manifest: {download.error}"})  # how Ollama ends a failed stream
                return
        yield _line({"error": "pull model manifest: the server is shutting down"})  # the events ended first
    finally:
        await events.aclose()


@router.post("/api/pull")
async def pull(body: PullRequest, registry: RegistryDep) -> Response:
    name = body.model or body.name or ""
    if not name:
        raise InvalidRequestError("model is required", param="model")
    repo = manage.hf_repo(check_name(name, "model"))
    if not registry.router:
        raise NotSupportedError("pulling a model needs router mode, where one server serves several models: start "
                                "kinetic with --models-dir DIR or --models-preset FILE")
    aliases = (manage.model_name(name),) if manage.model_name(name) != repo else ()
    served = registry.find(repo)
    if served is not None and not served.spec.remote and served.spec.path is not None:
        # Ollama answers a pull of a model it has with the pull's lines, every layer already complete
        registry.add_aliases(served, aliases)
        files = [served.spec.path, *([served.spec.mmproj] if served.spec.mmproj else [])]
        return _lines(manage.pulled_lines(files), body.stream)
    download = await registry.download(repo, aliases)
    if body.stream is not False:
        # subscribed before any await: the download's first progress comes after one
        return StreamingResponse(_pull_progress(download, registry.events.subscribe()), media_type=NDJSON)
    await download.done.wait()
    if download.error is not None:
        raise ServerError(f"pull model manifest: {download.error}")
    return JSONResponse({"status": "success"})


@router.post("/api/create")
async def create(body: CreateRequest, registry: RegistryDep) -> Response:
    name, source = manage.check_create(body)
    check_name(name, "model")
    known_or_valid(registry, source, "from")
    try:
        base = registry.base_of(source)
    except ModelNotFoundError:
        raise NotFoundError(f"model '{source}' not found", param="from") from None
    system, messages, options = manage.create_fields(body)
    template = manage.chat_template(body)
    parent = base if isinstance(base, DerivedModel) else DerivedModel(name=name, base=base.name)
    model = parent.derive(name, system=system, messages=messages, options=options, created=time.time(),
                          template=template)
    registry.put_derived(model)
    return _lines([{"status": "using existing model " + model.base}, {"status": "writing manifest"},
                   {"status": "success"}], body.stream)


@router.post("/api/copy")
async def copy(body: CopyRequest, registry: RegistryDep) -> Response:
    if not body.source or not body.destination:
        field = "source" if not body.source else "destination"
        raise InvalidRequestError(f"{field} is required", param=field)
    known_or_valid(registry, body.source, "source")
    check_name(body.destination, "destination")
    try:
        base = registry.base_of(manage.model_name(body.source))
    except ModelNotFoundError:
        raise NotFoundError(f"model '{body.source}' not found", param="source") from None
    name = manage.model_name(body.destination)
    model = base.renamed(name) if isinstance(base, DerivedModel) else DerivedModel(name=name, base=base.name)
    registry.put_derived(model)
    return Response(status_code=200)


@router.delete("/api/delete")
async def delete(body: DeleteRequest, registry: RegistryDep) -> Response:
    name = manage.model_name(body.model or body.name or "")
    if not name:
        raise InvalidRequestError("model is required", param="model")
    known_or_valid(registry, name, "model")
    if registry.remove_derived(name):
        return Response(status_code=200)
    if not registry.router:
        if registry.find(name) is None:
            raise NotFoundError(f"model '{name}' not found", param="model")
        raise InvalidRequestError(f"model '{name}' is this server's one model file: it cannot be deleted",
                                  param="model")
    try:
        await remove_model(registry, name)
    except NotFoundError:
        raise NotFoundError(f"model '{name}' not found", param="model") from None
    return Response(status_code=200)


@router.post("/api/push")
async def push() -> Response:
    raise NotSupportedError("kinetic does not push models to a registry: it serves models from files and from "
                            "Hugging Face; publish a GGUF on Hugging Face instead")
