"""Media fields into neutral parts (kinetic/protocols/common/media.py), in llama-server's forms and words
(server-common.cpp `handle_media`): what every protocol's translator shares."""

from __future__ import annotations

import pytest

from kinetic.chat.types import MediaPart
from kinetic.errors import InvalidRequestError
from kinetic.protocols.common import media


def test_base64_forgives_line_breaks_and_missing_padding() -> None:
    assert media.decode_base64("aGVs\nbG8=", "f") == b"hello"
    assert media.decode_base64("aGVsbG8", "f") == b"hello"
    assert media.decode_base64("aGVs\r\nbG8", "f") == b"hello"


@pytest.mark.parametrize("text", ["", "a", "aGVs bG8=", "aGVsbG8-", "====", "aGk=aGk="])
def test_anything_else_is_invalid_base64(text: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        media.decode_base64(text, "images[0]")
    assert err.value.param == "images[0]" and err.value.message == "Field 'images[0]': Invalid base64 value"


@pytest.mark.parametrize("value, modality, data, url", [
    ("data:image/png;base64,aGk=", "image", b"hi", None),
    ("DATA:Audio/WAV;BASE64,aGk=", "audio", b"hi", None),
    ("data:video/mp4;codecs=avc1;base64,aGk=", "video", b"hi", None),
    ("HTTPS://example.com/a.png", "image", None, "HTTPS://example.com/a.png"),
    ("file:///a.png", "image", None, "file:///a.png"),
    ("aGk=", "image", b"hi", None),
])
def test_a_media_value_is_decoded_or_kept_as_its_url(value: str, modality: str, data: bytes | None,
                                                     url: str | None) -> None:
    assert media.media_part(value, kind="image_url", modality="image", param="p") == MediaPart(
        "image_url", modality, data=data, url=url, param="p")


def test_an_inline_field_takes_bare_base64_or_a_data_url_but_no_url() -> None:
    assert media.inline_part("data:image/png;base64,aGk=", kind="images", modality="image", param="p").data == b"hi"
    with pytest.raises(InvalidRequestError, match="Invalid base64 value"):
        media.inline_part("https://example.com/a.png", kind="images", modality="image", param="p")
