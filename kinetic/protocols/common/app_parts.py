"""Parts of the server a protocol keeps on the app's state (its running completions, the streams' ping
interval): put there once by create_app, each under its type's name, and read back typed."""

from __future__ import annotations

from typing import TypeVar

from starlette.applications import Starlette

Part = TypeVar("Part")


def install(app: Starlette, part: object) -> None:
    setattr(app.state, type(part).__name__, part)


def installed(app: Starlette, kind: type[Part]) -> Part:
    part = getattr(app.state, kind.__name__)
    assert isinstance(part, kind), "an app made by kinetic.server.app.create_app"
    return part
