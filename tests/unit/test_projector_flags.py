"""The projector flags read as llama-server's (common/arg.cpp: -mm, -mmu, --mmproj-auto, --mmproj-offload,
-mmdev, --image-min/max-tokens), from the command line and from their variables, and build
EngineConfig.projector in model_config()."""

from __future__ import annotations

from pathlib import Path

import pytest

from kinetic.config.args import parse_serve_args
from kinetic.config.flag_status import reason_for
from kinetic.config.settings import ServerSettings, SettingsError
from kinetic.engine.llama import devices
from kinetic.engine.options import ProjectorOptions
from kinetic.model_registry.factory import finds_projector, model_config


def projector(*argv: str, environ: dict[str, str] | None = None) -> ProjectorOptions:
    return model_config(parse_serve_args(list(argv), environ=environ or {})).engine.projector


@pytest.fixture
def mmproj(tmp_path: Path) -> Path:
    path = tmp_path / "mmproj-F16.gguf"
    path.write_bytes(b"GGUF")
    return path


def test_defaults_are_llama_servers() -> None:
    settings = parse_serve_args([], environ={})
    assert (settings.mmproj_auto, settings.mmproj_offload, settings.mmproj_device) == (True, True, None)
    assert projector() == ProjectorOptions() and not projector().enabled and finds_projector(settings)


def test_the_flags_act_and_are_no_longer_warned_about(mmproj: Path) -> None:
    settings = parse_serve_args(["--mmproj", str(mmproj), "--no-mmproj-offload", "--image-min-tokens", "64",
                                 "--image-max-tokens", "1024"], environ={})
    assert settings.ignored_flags == () and not finds_projector(settings)
    assert model_config(settings).engine.projector == ProjectorOptions(
        path=str(mmproj), use_gpu=False, image_min_tokens=64, image_max_tokens=1024)
    for spelling in ("-mm", "-mmu", "--no-mmproj", "--mmproj-offload", "-mmdev", "--image-max-tokens"):
        assert reason_for(spelling) is None, spelling
    assert reason_for("--video-fps") is not None  # still ignored, with its row


def test_variables_are_llama_servers(mmproj: Path) -> None:
    env = {"LLAMA_ARG_MMPROJ": str(mmproj), "LLAMA_ARG_MMPROJ_OFFLOAD": "disabled",
           "LLAMA_ARG_IMAGE_MIN_TOKENS": "32", "LLAMA_ARG_IMAGE_MAX_TOKENS": "256"}
    settings = parse_serve_args([], environ=env)
    assert settings.ignored_env == ()
    assert projector(environ=env) == ProjectorOptions(path=str(mmproj), use_gpu=False, image_min_tokens=32,
                                                      image_max_tokens=256)
    assert projector(environ={"MTMD_BACKEND_DEVICE": "none", "KINETIC_MMPROJ_OFFLOAD": "on"}).use_gpu is False
    url = "https://example.org/mmproj-Q8_0.gguf"
    assert parse_serve_args([], environ={"LLAMA_ARG_MMPROJ_URL": url}).mmproj_url == url
    assert parse_serve_args(["-mmu", url], environ={"LLAMA_ARG_MMPROJ_URL": "https://x/y.gguf"}).mmproj_url == url


@pytest.mark.parametrize(("argv", "env"), [
    (["--no-mmproj"], {}), (["--no-mmproj-auto"], {}), ([], {"LLAMA_ARG_MMPROJ_AUTO": "0"}),
    ([], {"LLAMA_ARG_NO_MMPROJ_AUTO": "1"}), (["--mmproj-auto", "--no-mmproj"], {}),
])
def test_no_mmproj_spellings(argv: list[str], env: dict[str, str]) -> None:
    settings = parse_serve_args(argv, environ=env)
    assert settings.mmproj_auto is False and not finds_projector(settings)


def test_mmproj_url_goes_to_the_cache_or_to_mm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """-mm with -mmu names where the download goes, so it need not exist yet."""
    monkeypatch.setenv("KINETIC_CACHE_DIR", str(tmp_path))
    url = "https://example.org/repo/resolve/main/mmproj-model-f16.gguf?download=true"
    assert projector("-mmu", url).path == str(tmp_path / "mmproj" / "mmproj-model-f16.gguf")
    target = tmp_path / "later.gguf"
    assert projector("-mmu", url, "-mm", str(target)).path == str(target)
    assert not finds_projector(parse_serve_args(["-mmu", url], environ={}))


@pytest.mark.parametrize(("argv", "message"), [
    (["-mm", "/no/such/mmproj.gguf"], "for -mm: no such file"),
    (["--mmproj-url", "ftp://host/x.gguf"], "for --mmproj-url: expected an http:// or https:// URL"),
    (["-mmdev", "CUDA7"], "for -mmdev: invalid device: CUDA7"),
    (["--image-min-tokens", "-2"], "for --image-min-tokens: must be >= -1"),
    (["--image-max-tokens", "many"], "for --image-max-tokens: expected an integer"),
])
def test_bad_values_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        parse_serve_args(argv, environ={})


def test_mmproj_device_is_one_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """-mmdev checks its name as -dev does; one device only (llama.cpp: "only one device may be specified")."""
    monkeypatch.setattr(devices, "parse_device_list", lambda value: value.split(","))
    assert projector("-mmdev", "CUDA1") == ProjectorOptions(use_gpu=True, device="CUDA1")
    with pytest.raises(SettingsError, match="for -mmdev: only one device may be specified for mmproj"):
        parse_serve_args(["-mmdev", "CUDA0,CUDA1"], environ={})
    assert projector("-mmdev", "none") == ProjectorOptions(use_gpu=False, device=None)
    # without -mmdev the projector follows -dev's first device, as llama-server's does
    assert projector("-dev", "CUDA1,CUDA0") == ProjectorOptions(use_gpu=True, device="CUDA1")
    assert projector("-dev", "CUDA1", "-mmdev", "CUDA0").device == "CUDA0"
    assert projector("-dev", "CUDA1", "--no-mmproj-offload") == ProjectorOptions(use_gpu=False)


def test_dev_none_keeps_the_projector_off_the_gpu() -> None:
    assert projector("-dev", "none") == ProjectorOptions(use_gpu=False, device=None)


def test_settings_built_in_code_take_the_fields(mmproj: Path) -> None:
    settings = ServerSettings(mmproj=str(mmproj), image_max_tokens=9)
    assert model_config(settings).engine.projector.path == str(mmproj)
    with pytest.raises(ValueError, match="no such file"):
        ServerSettings(mmproj="/no/such.gguf")
