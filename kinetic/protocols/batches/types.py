"""The bodies of POST /v1/batches (JSON) and POST /v1/files (a multipart form: these fields and the `file`)."""

from __future__ import annotations

from kinetic.protocols.common.types import WireModel


class BatchRequest(WireModel):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None


class FileUpload(WireModel):
    purpose: str
