"""OpenAI's files and batches: POST/GET /v1/files, GET/DELETE /v1/files/{id}, GET /v1/files/{id}/content; POST/GET
/v1/batches, GET /v1/batches/{id}, POST /v1/batches/{id}/cancel (each also without /v1). Only files of purpose
`batch` are taken (and the `batch_output` files the runner writes). What each object is and who reads it:
store.py; how a batch runs: runner.py."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import Response

from kinetic.classroom.request_record import caller_of
from kinetic.protocols.batches.runner import BatchRunner
from kinetic.protocols.batches.store import BatchStore
from kinetic.protocols.batches.types import BatchRequest, FileUpload
from kinetic.protocols.common.app_parts import installed
from kinetic.protocols.common.store_database import listing, page

router = APIRouter()


def batch_store(request: Request) -> BatchStore:
    return installed(request.app, BatchStore)


@router.post("/v1/files")
@router.post("/files")
async def upload_file(body: Annotated[FileUpload, Form()], file: Annotated[UploadFile, File()],
                      request: Request) -> dict[str, Any]:
    content = await file.read()
    return batch_store(request).add_file(caller_of(request).name, body.purpose, file.filename or "upload.jsonl",
                                         content)


@router.get("/v1/files")
@router.get("/files")
async def list_files(request: Request, purpose: str | None = Query(None)) -> dict[str, Any]:
    return listing(batch_store(request).files(caller_of(request), purpose))


@router.get("/v1/files/{file_id}")
@router.get("/files/{file_id}")
async def retrieve_file(file_id: str, request: Request) -> dict[str, Any]:
    return batch_store(request).file(file_id, caller_of(request))


@router.get("/v1/files/{file_id}/content")
@router.get("/files/{file_id}/content")
async def file_content(file_id: str, request: Request) -> Response:
    return Response(batch_store(request).content(file_id, caller_of(request)), media_type="application/jsonl")


@router.delete("/v1/files/{file_id}")
@router.delete("/files/{file_id}")
async def delete_file(file_id: str, request: Request) -> dict[str, Any]:
    batch_store(request).delete_file(file_id, caller_of(request))
    return {"id": file_id, "object": "file", "deleted": True}


@router.post("/v1/batches")
@router.post("/batches")
async def create_batch(body: BatchRequest, request: Request) -> dict[str, Any]:
    created = batch_store(request).create(caller_of(request), input_file_id=body.input_file_id, endpoint=body.endpoint,
                                          completion_window=body.completion_window, metadata=body.metadata)
    installed(request.app, BatchRunner).wake()
    return created


@router.get("/v1/batches")
@router.get("/batches")
async def list_batches(request: Request, limit: int = Query(20), after: str | None = Query(None)) -> dict[str, Any]:
    """OpenAI's list: newest first, `limit` (1-100) batches after the batch `after`."""
    return page(batch_store(request).listed(caller_of(request)), limit=limit, order="desc", after=after,
                owner_id="batches")


@router.get("/v1/batches/{batch_id}")
@router.get("/batches/{batch_id}")
async def retrieve_batch(batch_id: str, request: Request) -> dict[str, Any]:
    return batch_store(request).get(batch_id, caller_of(request))


@router.post("/v1/batches/{batch_id}/cancel")
@router.post("/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, request: Request) -> dict[str, Any]:
    cancelled = batch_store(request).cancel(batch_id, caller_of(request))
    installed(request.app, BatchRunner).wake()
    return cancelled
