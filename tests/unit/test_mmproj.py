"""Where a model's multimodal projector comes from, without loading one: llama.cpp's choice of the repo's
mmproj file (common/download.cpp find_best_sibling), -hf from a Hugging Face cache laid out on disk, -mmu
from a local HTTP server, and router mode's presets and --models-dir. The projector files are dummies
that only start like a GGUF: nothing loads them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kinetic.backends.gguf_files import best_mmproj, best_sibling, quant_bits, quant_tag, resolve_hf, resolve_model
from kinetic.backends.sources import ModelSpec, model_specs, read_preset
from kinetic.config.args import parse_serve_args
from kinetic.config.settings import ServerSettings
from kinetic.errors import ModelLoadError
from kinetic.model_registry.factory import engine_files, model_config
from tests.fake_hub import FakeHub

GGUF = b"GGUF" + b"\0" * 16
REVISION = "0123456789abcdef0123456789abcdef01234567"


def gguf(folder: Path, name: str, body: bytes = GGUF) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
    return path


def files_of(spec: ModelSpec, settings: ServerSettings) -> tuple[Path, str | None]:
    """What the factory hands LlamaEngine: the model's path and ProjectorOptions.path."""
    path, projector = engine_files(spec, model_config(settings).engine, settings)
    return path, projector.path


# ------------------------------------------------------------------ llama.cpp's choice


def test_quant_tag_and_bits_read_like_llama_cpp() -> None:
    assert quant_tag("dir/model-Q4_K_M-00001-of-00002.gguf") == "Q4_K_M"
    assert quant_tag("mmproj-model-f16.gguf") == "F16" and quant_tag("mmproj.gguf") == ""
    assert [quant_bits(t) for t in ("Q4_K_M", "BF16", "IQ2_XXS", "")] == [4, 16, 2, 0]


def test_mmproj_closest_to_the_models_bits() -> None:
    files = ["README.md", "model-Q4_K_M.gguf", "model-Q8_0.gguf", "model-BF16.gguf",
             "mmproj-F16.gguf", "mmproj-Q8_0.gguf", "mmproj-F32.gguf"]
    assert best_mmproj(files, "model-Q8_0.gguf") == "mmproj-Q8_0.gguf"
    assert best_mmproj(files, "model-Q4_K_M.gguf") == "mmproj-Q8_0.gguf"  # |8-4| < |16-4|
    assert best_mmproj(files, "model-BF16.gguf") == "mmproj-F16.gguf"
    assert best_mmproj(["model-Q8_0.gguf", "README.md"], "model-Q8_0.gguf") is None


def test_mmproj_in_the_deepest_shared_folder_first() -> None:
    files = ["mmproj-Q8_0.gguf", "Q4/model-Q4_K_M.gguf", "Q4/mmproj-F16.gguf", "other/mmproj-Q4_0.gguf"]
    # the model's own folder beats the top one, whatever the bits; a folder beside it never counts
    assert best_mmproj(files, "Q4/model-Q4_K_M.gguf") == "Q4/mmproj-F16.gguf"
    assert best_mmproj(files, "model-Q4_K_M.gguf") == "mmproj-Q8_0.gguf"
    assert best_mmproj(["deep/er/mmproj-Q4_0.gguf"], "deep/model-Q4_0.gguf") is None


def test_sibling_with_the_exact_tag_before_the_closest_bits() -> None:
    files = ["mtp-Q4_0.gguf", "mtp-Q4_K_M.gguf", "mtp-F16.gguf"]
    assert best_sibling(files, "model-Q4_K_M.gguf", "mtp-", "q4_k_m") == "mtp-Q4_K_M.gguf"
    assert best_sibling(files, "model-Q4_K_M.gguf", "mtp-") == "mtp-Q4_0.gguf"  # a tie: the first listed
    assert best_sibling(files, "model-Q4_K_M.gguf", "mtp-", "F16") == "mtp-F16.gguf"


# ------------------------------------------------------------------ -hf from the cache


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Hugging Face cache (hub/models--ORG--REPO/{refs/main, snapshots/REV/FILE}) holding a model and
    two projectors, with the network off."""
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    repo = cache / "models--test-org--vision-GGUF"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)
    snapshot = repo / "snapshots" / REVISION
    for name in ("vision-Q8_0.gguf", "mmproj-vision-F16.gguf", "mmproj-vision-Q8_0.gguf"):
        gguf(snapshot, name)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("KINETIC_CACHE_DIR", str(tmp_path / "kinetic-cache"))
    return snapshot


def test_hf_offline_finds_the_repos_projector(hub: Path) -> None:
    resolved = resolve_hf("test-org/vision-GGUF:Q8_0", None, offline=True)
    assert resolved.path == hub / "vision-Q8_0.gguf" and resolved.mmproj == hub / "mmproj-vision-Q8_0.gguf"
    assert resolve_hf("test-org/vision-GGUF", None, offline=True, mmproj=False).mmproj is None
    assert resolve_model(None, "test-org/vision-GGUF", None, True, mmproj=True).mmproj == resolved.mmproj


def test_hf_projector_reaches_projector_options(hub: Path, tmp_path: Path) -> None:
    """-hf's projector unless --no-mmproj; an explicit -mm wins over it."""
    spec = ModelSpec(name="v", hf_repo="test-org/vision-GGUF")
    settings = parse_serve_args(["-hf", "test-org/vision-GGUF", "--offline"], environ={})
    assert files_of(spec, settings) == (hub / "vision-Q8_0.gguf", str(hub / "mmproj-vision-Q8_0.gguf"))
    settings = parse_serve_args(["-hf", "test-org/vision-GGUF", "--offline", "--no-mmproj"], environ={})
    assert files_of(spec, settings) == (hub / "vision-Q8_0.gguf", None)
    own = gguf(tmp_path, "own-mmproj.gguf")
    settings = parse_serve_args(["-hf", "test-org/vision-GGUF", "--offline", "-mm", str(own)], environ={})
    assert files_of(spec, settings)[1] == str(own)


def test_hf_online_downloads_the_projector_with_the_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants as hf

    files = {name: gguf(tmp_path / "repo", name) for name in ("vision-Q8_0.gguf", "mmproj-vision-F16.gguf",
                                                             "mmproj-vision-Q8_0.gguf")}
    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with FakeHub({"test-org/vision-GGUF": files}) as hub:
        monkeypatch.setattr(hf, "ENDPOINT", hub.url)
        monkeypatch.setattr(hf, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}")
        text_only = resolve_hf("test-org/vision-GGUF:Q8_0", None, offline=False, mmproj=False)
        assert text_only.mmproj is None
        assert not [r for r in hub.requests if r.startswith("GET") and "mmproj" in r]
        resolved = resolve_hf("test-org/vision-GGUF:Q8_0", None, offline=False)
    assert resolved.mmproj is not None and resolved.mmproj.name == "mmproj-vision-Q8_0.gguf"
    assert resolved.mmproj.parent == resolved.path.parent  # in the same snapshot of the Hugging Face cache
    assert [r for r in hub.requests if r.startswith("GET") and "/resolve/" in r and "mmproj" in r] == [
        "GET /test-org/vision-GGUF/resolve/main/mmproj-vision-Q8_0.gguf"]


def test_a_projector_that_is_no_gguf_is_named(tmp_path: Path) -> None:
    model, bad = gguf(tmp_path, "m.gguf"), gguf(tmp_path, "mmproj-bad.gguf", b"nope")
    settings = parse_serve_args(["-m", str(model), "-mm", str(bad)], environ={})
    with pytest.raises(ModelLoadError, match="not a GGUF file .*mmproj-bad.gguf"):
        files_of(ModelSpec(name="m", path=model), settings)


# ------------------------------------------------------------------ -mmu


class FileServer:
    """One file over HTTP on 127.0.0.1, counting the GETs."""

    def __init__(self, body: bytes):
        self.gets = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                server.gets += 1
                found = self.path.startswith("/files/")
                self.send_response(200 if found else 404)
                self.send_header("Content-Length", str(len(body) if found else 0))
                self.end_headers()
                if found:
                    self.wfile.write(body)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/files/mmproj-remote-F16.gguf?download=1"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def file_server() -> Iterator[FileServer]:
    server = FileServer(GGUF + b"projector")
    yield server
    server.close()


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KINETIC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return gguf(tmp_path, "m.gguf")


def test_mmproj_url_downloads_once_into_the_cache(file_server: FileServer, model: Path, tmp_path: Path) -> None:
    settings = parse_serve_args(["-m", str(model), "-mmu", file_server.url], environ={})
    spec = ModelSpec(name="m", path=model)
    target = tmp_path / "cache" / "mmproj" / "mmproj-remote-F16.gguf"
    assert files_of(spec, settings) == (model, str(target))
    assert target.read_bytes() == GGUF + b"projector" and file_server.gets == 1
    assert files_of(spec, settings)[1] == str(target) and file_server.gets == 1  # reused, no request
    assert not list(target.parent.glob("*.partial"))


def test_mmproj_url_writes_where_mm_says(file_server: FileServer, model: Path, tmp_path: Path) -> None:
    target = tmp_path / "here" / "p.gguf"
    target.parent.mkdir()
    settings = parse_serve_args(["-m", str(model), "-mmu", file_server.url, "-mm", str(target)], environ={})
    assert files_of(ModelSpec(name="m", path=model), settings)[1] == str(target) and target.exists()


def test_mmproj_url_offline_or_unreachable_is_one_line(file_server: FileServer, model: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ModelSpec(name="m", path=model)
    for argv, env in (([], {"HF_HUB_OFFLINE": "1"}), (["--offline"], {})):
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        settings = parse_serve_args(["-m", str(model), "-mmu", file_server.url, *argv], environ={})
        with pytest.raises(ModelLoadError) as error:
            files_of(spec, settings)
        assert "network is off" in str(error.value) and "\n" not in str(error.value)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert file_server.gets == 0
    closed = file_server.url.rsplit(":", 1)[0] + ":9/mmproj.gguf"  # the discard port: nothing listens
    settings = parse_serve_args(["-m", str(model), "-mmu", closed], environ={})
    with pytest.raises(ModelLoadError, match=r"^cannot download the projector .*-mm PATH") as error:
        files_of(spec, settings)
    assert "\n" not in str(error.value)
    missing = file_server.url.replace("/files/", "/gone/")
    with pytest.raises(ModelLoadError, match="HTTP 404"):
        files_of(spec, parse_serve_args(["-m", str(model), "-mmu", missing], environ={}))


# ------------------------------------------------------------------ router mode


def test_models_dir_gives_a_sub_folders_projector_to_its_model(tmp_path: Path) -> None:
    gguf(tmp_path, "top.gguf")
    gguf(tmp_path, "mmproj-top.gguf")  # beside a top-level model: may be anyone's, so nobody's
    gguf(tmp_path, "vision/vision-Q8_0.gguf")
    gguf(tmp_path, "vision/mmproj-vision-F16.gguf")
    gguf(tmp_path, "vision/mmproj-vision-Q8_0.gguf")
    gguf(tmp_path, "text/text-Q4_0.gguf")
    specs, _ = model_specs(parse_serve_args(["--models-dir", str(tmp_path)], environ={}))
    assert {spec.name: spec.mmproj for spec in specs} == {
        "top": None, "vision-Q8_0": tmp_path / "vision" / "mmproj-vision-Q8_0.gguf", "text-Q4_0": None}
    vision = next(spec for spec in specs if spec.name == "vision-Q8_0")
    settings = ServerSettings()
    assert files_of(vision, settings)[1] == str(tmp_path / "vision" / "mmproj-vision-Q8_0.gguf")
    assert files_of(vision, settings.replace(mmproj_auto=False))[1] is None


def test_preset_sections_have_their_own_projector(tmp_path: Path) -> None:
    for name in ("a.gguf", "b.gguf", "c.gguf", "proj/mmproj-a.gguf", "mmproj-all.gguf"):
        gguf(tmp_path, name)
    preset = tmp_path / "models.ini"
    preset.write_text("[a]\nmodel = a.gguf\nmmproj = proj/mmproj-a.gguf\nimage-max-tokens = 512\n"
                      "mmproj-offload = false\n\n[b]\nmodel = b.gguf\nLLAMA_ARG_MMPROJ = mmproj-all.gguf\n"
                      "MTMD_BACKEND_DEVICE = none\n\n[c]\nmodel = c.gguf\n"
                      "\n[h]\nhf = org/repo\nno-mmproj = true\n")
    specs, ignored = read_preset(preset, ServerSettings())
    a, b, c, h = specs
    assert ignored == []
    assert a.settings is not None and b.settings is not None and h.settings is not None and c.settings is None
    options = model_config(a.settings).engine.projector
    assert (options.path, options.image_max_tokens, options.use_gpu) == (
        str(tmp_path / "proj" / "mmproj-a.gguf"), 512, False)
    assert model_config(b.settings).engine.projector.path == str(tmp_path / "mmproj-all.gguf")
    assert model_config(b.settings).engine.projector.use_gpu is False  # -mmdev none
    assert h.settings.mmproj_auto is False
    assert files_of(a, a.settings)[1] == str(tmp_path / "proj" / "mmproj-a.gguf")
    assert files_of(c, ServerSettings())[1] is None
