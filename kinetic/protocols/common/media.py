"""Media fields as the protocols send them, made into neutral MediaParts.

A file carried in the request (a data: URL, raw base64) is decoded here, so a bad one is a 400 naming its
field before anything else runs; a file named by the request (http(s)://, file://) is kept as its URL, and
the backend loads it (kinetic/backends/media_source.py), where the server's --media-path and fetch rules
apply. Pure: nothing is fetched or read here.

The accepted forms are llama-server's (server-common.cpp `handle_media`): `data:image|audio|video/...;base64,`,
raw base64, http(s):// and file://.
"""

from __future__ import annotations

import base64
import binascii
import re

from kinetic.chat.types import MediaKind, MediaPart
from kinetic.errors import field_error

URL_SCHEMES = ("http://", "https://", "file://")
DATA_MODALITIES: dict[str, MediaKind] = {"image": "image", "audio": "audio", "video": "video"}
_LINE_BREAKS = re.compile(r"[\r\n]+")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


def decode_base64(text: str, param: str) -> bytes:
    """Standard base64, line breaks and missing padding forgiven (MIME tools wrap it, some clients trim the
    padding); anything else, or nothing at all, is llama-server's "Invalid base64 value" naming the field."""
    compact = _LINE_BREAKS.sub("", text)
    try:
        data = base64.b64decode(compact + "=" * (-len(compact) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise field_error(param, "Invalid base64 value") from None
    if not data:
        raise field_error(param, "Invalid base64 value")
    return data


def _data_url(url: str, param: str) -> tuple[MediaKind, bytes]:
    """The modality a data: URL names and its decoded bytes (llama-server's checks and words)."""
    header, comma, payload = url.partition(",")
    if not comma or "," in payload:
        raise field_error(param, "Invalid uri-encoded base64 value")
    media_type = header[len("data:"):].split(";", 1)[0].lower()
    modality = DATA_MODALITIES.get(media_type.split("/", 1)[0]) if "/" in media_type else None
    if modality is None:
        raise field_error(param, f"Invalid uri format: {header} (a data: URL of an image, audio or video)")
    if not header.lower().endswith(";base64"):
        raise field_error(param, "uri must be base64 encoded")
    return modality, decode_base64(payload, param)


def media_part(value: str | None, *, kind: str, modality: MediaKind, param: str) -> MediaPart:
    """One media field's text: a data: URL (its own modality wins), an http(s):// or file:// URL (kept for
    the backend to load), or raw base64. A missing value or another scheme is a 400 naming the field."""
    if not value:
        raise field_error(param, "is required: a data: URL, raw base64, or an http(s):// or file:// URL")
    if value[:8].lower().startswith(URL_SCHEMES):
        return MediaPart(kind=kind, modality=modality, url=value, param=param)
    if value[:5].lower() == "data:":
        data_modality, data = _data_url(value, param)
        return MediaPart(kind=kind, modality=data_modality, data=data, param=param)
    scheme = _SCHEME.match(value)
    if scheme and "://" in value[: scheme.end() + 2]:
        raise field_error(param, f"unsupported URL scheme '{scheme.group(1)}': use http(s)://, file://, "
                                 "a data: URL or raw base64")
    return MediaPart(kind=kind, modality=modality, data=decode_base64(value, param), param=param)


def inline_part(data: str | None, *, kind: str, modality: MediaKind, param: str) -> MediaPart:
    """A field that is base64 by definition (Ollama's `images`, Anthropic's base64 source, `multimodal_data`);
    a data: URL there is taken too, since clients paste one (Open WebUI strips it, others do not)."""
    if not data:
        raise field_error(param, "is required: the file's base64")
    if data[:5].lower() == "data:":
        data_modality, decoded = _data_url(data, param)
        return MediaPart(kind=kind, modality=data_modality, data=decoded, param=param)
    return MediaPart(kind=kind, modality=modality, data=decode_base64(data, param), param=param)


def multimodal_files(files: object, param: str) -> tuple[MediaPart, ...]:
    """llama-server's `multimodal_data` (in a `{"prompt_string", "multimodal_data"}` prompt object): base64
    files, one for each media marker in the prompt text, in order. `param` is the field (`prompt.multimodal_data`)."""
    if not isinstance(files, list) or not all(isinstance(file, str) for file in files):
        raise field_error(param, "must be an array of base64 strings")
    return tuple(inline_part(file, kind="multimodal_data", modality="image", param=f"{param}[{index}]")
                 for index, file in enumerate(files))
