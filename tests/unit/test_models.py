import pytest

from kinetic.backends.gguf_files import check_gguf, pick_gguf, shard_names, split_hf_repo
from kinetic.errors import ModelLoadError

FILES = ["README.md", "model-Q8_0.gguf", "model-Q4_K_M.gguf", "mmproj-model-f16.gguf", "model-BF16.gguf"]


def test_split_hf_repo() -> None:
    assert split_hf_repo("ggml-org/Qwen3.5-0.8B-GGUF") == ("ggml-org/Qwen3.5-0.8B-GGUF", None)
    assert split_hf_repo("user/repo:q8_0") == ("user/repo", "q8_0")
    with pytest.raises(ModelLoadError):
        split_hf_repo("no-slash")


def test_pick_default_quant_then_fallbacks() -> None:
    assert pick_gguf(FILES, None) == "model-Q4_K_M.gguf"
    assert pick_gguf(["a-Q8_0.gguf", "a-BF16.gguf"], None) == "a-Q8_0.gguf"
    assert pick_gguf(FILES, "q8_0") == "model-Q8_0.gguf"
    with pytest.raises(ModelLoadError, match="no file for quant Q2_K"):
        pick_gguf(FILES, "Q2_K")


def test_pick_first_shard_of_split_model() -> None:
    files = ["big-Q4_K_M-00002-of-00002.gguf", "big-Q4_K_M-00001-of-00002.gguf"]
    assert pick_gguf(files, None) == "big-Q4_K_M-00001-of-00002.gguf"


def test_check_gguf_names_the_file(tmp_path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelLoadError, match="nope.gguf"):
        check_gguf(missing)
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match="broken.gguf"):
        check_gguf(broken)


def test_shard_names_of_a_split_model() -> None:
    assert shard_names("big-Q4_K_M-00001-of-00003.gguf") == [
        "big-Q4_K_M-00001-of-00003.gguf", "big-Q4_K_M-00002-of-00003.gguf", "big-Q4_K_M-00003-of-00003.gguf"]
    assert shard_names("dir/small-Q8_0.gguf") == ["dir/small-Q8_0.gguf"]
