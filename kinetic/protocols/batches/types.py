"""The JSON body of POST /v1/batches (the upload of POST /v1/files is a multipart form: routes.py)."""

from __future__ import annotations

from kinetic.protocols.common.types import WireModel


class BatchRequest(WireModel):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
