import pytest

from kinetic.cli import parse_serve_args, split_ignored_flags
from kinetic.settings import FLAGS


def flag_names() -> set[str]:
    return {name for flag in FLAGS for name in flag.names}


@pytest.mark.parametrize("spelling", ["-m", "--model", "-hf", "--hf-repo", "-hff", "--hf-file", "-a", "--alias",
                                      "-c", "--ctx-size", "-np", "--parallel", "--host", "--port", "-t",
                                      "--threads", "-n", "--n-predict", "--temp", "--seed", "--api-key",
                                      "--api-key-file", "--chat-template", "--chat-template-file", "--jinja",
                                      "--reasoning-format", "--slots", "--metrics", "--embeddings",
                                      "--cors-origins", "-v", "--verbose", "--offline"])
def test_llama_server_spellings_exist(spelling: str) -> None:
    assert spelling in flag_names()


def test_lab_command_line_parses() -> None:
    s = parse_serve_args(["-m", "ggml-model.gguf", "--host", "127.0.0.1", "--port", "8080", "-c", "2048",
                          "-np", "1", "-a", "qwen-0.8b"], environ={})
    assert (s.model, s.host, s.port, s.ctx_size, s.parallel, s.alias) == ("ggml-model.gguf", "127.0.0.1", 8080,
                                                                           2048, 1, "qwen-0.8b")


def test_positional_model_and_negations() -> None:
    s = parse_serve_args(["model.gguf", "--no-jinja", "--no-slots"], environ={})
    assert s.model == "model.gguf" and s.jinja is False and s.slots is False


def test_environment_then_command_line() -> None:
    env = {"LLAMA_ARG_CTX_SIZE": "1024", "KINETIC_PORT": "9000", "LLAMA_ARG_EMBEDDINGS": "true"}
    s = parse_serve_args(["--port", "9100"], environ=env)
    assert s.ctx_size == 1024 and s.port == 9100 and s.embeddings is True


def test_unimplemented_llama_server_flags_are_set_aside_with_values() -> None:
    kept, ignored = split_ignored_flags(["-ngl", "99", "-m", "x.gguf", "--flash-attn=on", "-c", "512"])
    assert kept == ["-m", "x.gguf", "-c", "512"] and ignored == ["-ngl", "--flash-attn=on"]
    s = parse_serve_args(["-ngl", "99", "x.gguf", "--mlock", "--no-webui"], environ={})
    assert s.model == "x.gguf" and set(s.ignored_flags) == {"-ngl", "--mlock", "--no-webui"}


def test_api_keys_from_flag_and_file(tmp_path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("# class keys\nalpha\n\nbeta\n")
    s = parse_serve_args(["--api-key", "k1,k2", "--api-key-file", str(keys)], environ={})
    assert s.api_keys() == ("k1", "k2", "alpha", "beta")
    keys.write_text("# class keys\nalpha ann\nbeta  # no name\n")
    assert s.api_keys() == ("k1", "k2", "alpha", "beta") and s.key_ring().name_for("alpha") == "ann"
