"""FastAPI dependencies: the shared Service, read from app.state (no module-level state)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from kinetic.errors import UnavailableError
from kinetic.service import Service


def get_service(request: Request) -> Service:
    service: Service = request.app.state.service
    if not service.ready:
        raise UnavailableError("Loading model")
    return service


ServiceDep = Annotated[Service, Depends(get_service)]
