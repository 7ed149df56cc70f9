"""Slot files of slots that hold images (POST /slots/{id}?action=save|restore), on the bundled Gemma with its tiny
test projector, as llama-server's test_slot_save.py has them: the file keeps each image's record beside the
tokens, a restored slot's cells are reused by the next request with the same image (and never by another
image), across a restart too, and a server without the projector refuses the file as llama-server does."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.projector_model import png_image, tiny_projector
from tests.server import KineticServer

pytestmark = pytest.mark.e2e

GEMMA_IMAGE_TOKENS = 16  # the tiny gemma3 projector pools every image to 16 embeddings
CAT, TRUCK = png_image(64, 64, 71), png_image(64, 64, 72)


@pytest.fixture(scope="module")
def slot_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def seer(model_lock: None, slot_folder: Path) -> Iterator[KineticServer]:
    with KineticServer("-mm", str(tiny_projector("gemma3")), "-c", "4096", "-np", "2", "--swa-full",
                       "--slot-save-path", str(slot_folder)) as server:
        yield server


def image_prompt(url: str, text: str, *images: bytes) -> dict[str, Any]:
    marker = httpx.get(url + "/props", timeout=10).json()["media_marker"]
    return {"prompt_string": text.replace("<image>", marker),
            "multimodal_data": [base64.b64encode(image).decode() for image in images]}


def complete(url: str, prompt: dict[str, Any] | str, id_slot: int) -> dict[str, Any]:
    body = {"prompt": prompt, "id_slot": id_slot, "cache_prompt": True, "temperature": 0, "top_k": 1,
            "n_predict": 6}
    response = httpx.post(url + "/completion", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def slot_action(url: str, id_slot: int, action: str, filename: str | None = None) -> httpx.Response:
    body = {"filename": filename} if filename else {}
    return httpx.post(url + f"/slots/{id_slot}?action={action}", json=body, timeout=60)


def test_a_slot_with_an_image_is_saved_erased_and_restored_and_the_same_image_reuses_it(seer: KineticServer,
                                                                                        slot_folder: Path) -> None:
    prompt = image_prompt(seer.url, "What is this: <image>\n", CAT)
    first = complete(seer.url, prompt, id_slot=1)
    n_full = first["timings"]["prompt_n"]
    assert first["timings"]["cache_n"] == 0 and n_full > GEMMA_IMAGE_TOKENS
    saved = slot_action(seer.url, 1, "save", "cat.bin")
    assert saved.status_code == 200, saved.text
    n_saved, n_written = saved.json()["n_saved"], saved.json()["n_written"]
    assert n_saved >= n_full and n_written == (slot_folder / "cat.bin").stat().st_size
    erased = slot_action(seer.url, 1, "erase")
    assert erased.status_code == 200 and erased.json()["n_erased"] == n_saved
    restored = slot_action(seer.url, 0, "restore", "cat.bin")
    assert restored.status_code == 200, restored.text
    assert restored.json()["n_restored"] == n_saved and restored.json()["n_read"] == n_written
    # another image after the same text: only the text before it may come from the restored cells
    truck = complete(seer.url, image_prompt(seer.url, "What is this: <image>\n", TRUCK), id_slot=0)
    assert truck["timings"]["cache_n"] < 10
    assert truck["timings"]["prompt_n"] == n_full - truck["timings"]["cache_n"]
    # restored again, the same image: all but the last token come from the file, and the answer is the same
    assert slot_action(seer.url, 0, "restore", "cat.bin").json()["n_restored"] == n_saved
    again = complete(seer.url, prompt, id_slot=0)
    assert again["timings"]["cache_n"] == n_full - 1 and again["timings"]["prompt_n"] == 1
    assert again["content"] == first["content"]


def test_two_images_restore_into_another_slot(seer: KineticServer) -> None:
    prompt = image_prompt(seer.url, "A: <image> B: <image>\n", CAT, TRUCK)
    first = complete(seer.url, prompt, id_slot=1)
    n_full = first["timings"]["prompt_n"]
    assert n_full > 2 * GEMMA_IMAGE_TOKENS
    n_saved = slot_action(seer.url, 1, "save", "two.bin").json()["n_saved"]
    complete(seer.url, "Something else entirely", id_slot=0)
    assert slot_action(seer.url, 0, "restore", "two.bin").json()["n_restored"] == n_saved
    again = complete(seer.url, prompt, id_slot=0)
    assert again["timings"]["cache_n"] == n_full - 1 and again["timings"]["prompt_n"] == 1
    assert again["content"] == first["content"]
    # a restored slot saves again as it was (the images' records came back with it)
    assert slot_action(seer.url, 0, "restore", "two.bin").status_code == 200
    resaved = slot_action(seer.url, 0, "save", "two-again.bin")
    assert resaved.status_code == 200 and resaved.json()["n_saved"] == n_saved


def test_a_restore_reuses_the_image_after_a_restart(seer: KineticServer) -> None:
    prompt = image_prompt(seer.url, "Look: <image> It shows", CAT)
    first = complete(seer.url, prompt, id_slot=0)
    n_full = first["timings"]["prompt_n"] + first["timings"]["cache_n"]
    n_saved = slot_action(seer.url, 0, "save", "restart.bin").json()["n_saved"]
    seer.stop()
    seer.start()  # a new process, a new media marker: the image is known by its content alone
    restored = slot_action(seer.url, 0, "restore", "restart.bin")
    assert restored.status_code == 200 and restored.json()["n_restored"] == n_saved
    again = complete(seer.url, image_prompt(seer.url, "Look: <image> It shows", CAT), id_slot=0)
    assert again["timings"]["cache_n"] == n_full - 1 and again["timings"]["prompt_n"] == 1
    assert again["content"] == first["content"]


def test_a_server_without_the_projector_refuses_the_file_and_the_slot_stays_usable(seer: KineticServer,
                                                                                   slot_folder: Path) -> None:
    complete(seer.url, image_prompt(seer.url, "What is this: <image>\n", CAT), id_slot=0)
    assert slot_action(seer.url, 0, "save", "no-projector.bin").status_code == 200
    with KineticServer("-c", "4096", "-np", "2", "--swa-full", "--slot-save-path", str(slot_folder)) as text_only:
        refused = slot_action(text_only.url, 0, "restore", "no-projector.bin")
        assert refused.status_code == 400
        assert refused.json()["error"]["message"] == \
            "Unable to restore slot: Cannot restore media tokens without an mmproj"
        other = complete(text_only.url, "The quick brown fox", id_slot=1)
        after = complete(text_only.url, "The quick brown fox", id_slot=0)
        assert after["timings"]["cache_n"] == 0 and after["content"] == other["content"]
