"""The Hugging Face cache's models as llama-server's router reads them (kinetic/backends/hub_cache.py), and a
preset's dedup-cache-models (kinetic/backends/sources.py), on caches laid out by tests/fake_hub.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from kinetic.backends.hub_cache import cached_models, hub_cache_dir, resolve_cached
from kinetic.backends.sources import from_hub_cache, read_preset, with_cache
from kinetic.config.settings import ServerSettings
from tests.fake_hub import lay_out_cache


@pytest.fixture()
def hub(tmp_path: Path) -> Path:
    blob = tmp_path / "blob.gguf"
    blob.write_bytes(b"GGUF")
    return lay_out_cache(tmp_path / "hub", {
        "org/vision-GGUF": {"vision-Q8_0.gguf": blob, "vision-Q4_K_M.gguf": blob, "mmproj-vision-f16.gguf": blob},
        "org/split-GGUF": {"big-Q2_K-00001-of-00002.gguf": blob, "big-Q2_K-00002-of-00002.gguf": blob},
        "org/models": {"tinyllamas/stories260K.gguf": blob, "bert/bge-F16.gguf": blob, "mtp-head-Q8_0.gguf": blob},
    })


def test_the_cache_folder_is_llama_cpps(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for variable in ("LLAMA_CACHE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub_cache_dir() == tmp_path / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", "/h")
    assert hub_cache_dir() == Path("/h/hub")
    monkeypatch.setenv("HF_HUB_CACHE", "/c")
    assert hub_cache_dir() == Path("/c")
    monkeypatch.setenv("LLAMA_CACHE", "/l")  # the hub folder itself, before every other
    assert hub_cache_dir() == Path("/l")


def test_models_are_named_repo_tag_once_with_their_projector(hub: Path) -> None:
    found = {model.name: model for model in cached_models(hub)}
    # no tag (stories260K.gguf), a second shard, a draft head and the projector are not models
    assert sorted(found) == ["org/models:F16", "org/split-GGUF:Q2_K", "org/vision-GGUF:Q4_K_M", "org/vision-GGUF:Q8_0"]
    assert found["org/vision-GGUF:Q8_0"].mmproj is not None
    assert found["org/vision-GGUF:Q8_0"].mmproj.name == "mmproj-vision-f16.gguf"
    assert found["org/models:F16"].path.name == "bge-F16.gguf" and found["org/models:F16"].mmproj is None


def test_a_repo_without_a_valid_ref_is_not_read(hub: Path) -> None:
    (hub / "models--org--split-GGUF" / "refs" / "main").write_text("not-a-commit")
    assert "org/split-GGUF:Q2_K" not in [model.name for model in cached_models(hub)]


def test_an_hf_spec_resolves_as_llama_cpp_resolves_it(hub: Path) -> None:
    assert resolve_cached("org/vision-GGUF", root=hub).name == "vision-Q4_K_M.gguf"  # Q4_K_M first
    assert resolve_cached("org/vision-GGUF:q8_0", root=hub).name == "vision-Q8_0.gguf"
    assert resolve_cached("org/vision-GGUF:F16", root=hub) is None
    assert resolve_cached("org/models", "bert/bge-F16.gguf", root=hub).name == "bge-F16.gguf"
    assert resolve_cached("org/nothing", root=hub) is None and resolve_cached("no-slash", root=hub) is None


def test_dedup_cache_models_hides_the_cache_entries_a_preset_serves(hub: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_CACHE", str(hub))
    preset = tmp_path / "preset.ini"
    preset.write_text("[*]\ndedup-cache-models = 1\n\n[chat]\nhf-repo = org/vision-GGUF:Q8_0\n"
                      "spec-draft-hf = org/models\n\n[other]\nhf-repo = org/split-GGUF\ndedup-cache-models = 0\n")
    specs, ignored = read_preset(preset, ServerSettings())
    assert ignored == ["[chat] spec-draft-hf"]  # read for dedup only: no draft model is loaded
    listed = with_cache(specs, from_hub_cache())
    hidden = sorted(spec.name for spec in listed if spec.hidden)
    assert hidden == ["org/models:F16", "org/vision-GGUF:Q8_0"]
    assert [spec.name for spec in listed if spec.source == "preset"] == ["chat", "other"]
    assert "org/split-GGUF:Q2_K" in [spec.name for spec in listed if not spec.hidden]
