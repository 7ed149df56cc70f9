from __future__ import annotations

from pathlib import Path

import pytest

from kinetic import __version__
from kinetic.cli import main
from kinetic.config.args import InfoRequested, help_text, parse_serve_args
from kinetic.config.flags import FLAGS, FLAGS_BY_SPELLING
from kinetic.config.llama_flags import by_spelling, llama_server_flags
from kinetic.config.settings import ServerSettings, SettingsError


def flag_names() -> set[str]:
    return {name for flag in FLAGS for name in (*flag.names, *flag.negations)}


@pytest.mark.parametrize("spelling", ["-m", "--model", "-hf", "--hf-repo", "-hff", "--hf-file", "-a", "--alias",
                                      "-c", "--ctx-size", "-np", "--parallel", "--host", "--port", "-t",
                                      "--threads", "-n", "--n-predict", "--temp", "--seed", "--api-key",
                                      "--api-key-file", "--chat-template", "--chat-template-file", "--jinja",
                                      "--reasoning-format", "--slots", "--metrics", "--embeddings",
                                      "--cors-origins", "-v", "--verbose", "--offline", "-b", "--batch-size",
                                      "-ub", "--ubatch-size", "--no-jinja", "--no-slots"])
def test_llama_server_spellings_exist(spelling: str) -> None:
    assert spelling in flag_names()


@pytest.mark.parametrize("flag", [f for f in FLAGS if f.llama], ids=lambda f: f.names[0])
def test_implemented_flag_reads_like_llama_server(flag) -> None:
    """Same spellings, same number of values, same variable as the vendored llama-server's flag."""
    assert set(flag.names) == set(flag.llama.names) and set(flag.negations) == set(flag.llama.negations)
    assert flag.is_switch == (flag.llama.values == 0)  # a value flag reads its one or two values (serve_args)
    assert flag.llama_env == flag.llama.env


def test_every_setting_has_one_flag() -> None:
    fields = set(ServerSettings.model_fields) - {"model_args", "ignored_flags", "ignored_env"}
    assert fields == {flag.dest for flag in FLAGS}
    assert len(FLAGS_BY_SPELLING) == sum(len(f.names) + len(f.negations) for f in FLAGS)


def test_lab_command_line_parses() -> None:
    s = parse_serve_args(["-m", "ggml-model.gguf", "--host", "127.0.0.1", "--port", "8080", "-c", "2048",
                          "-np", "1", "-a", "qwen-0.8b"], environ={})
    assert (s.model, s.host, s.port, s.ctx_size, s.parallel, s.alias) == ("ggml-model.gguf", "127.0.0.1", 8080,
                                                                           2048, 1, "qwen-0.8b")


def test_positional_model_and_negations() -> None:
    s = parse_serve_args(["model.gguf", "--no-jinja", "--no-slots"], environ={})
    assert s.model == "model.gguf" and s.jinja is False and s.slots is False


def test_long_flags_take_underscores_and_equals_like_llama_server() -> None:
    s = parse_serve_args(["--ctx_size", "512", "--port=9001", "--api-key", "-secret-", "-s", "-1"], environ={})
    assert (s.ctx_size, s.port, s.api_key, s.seed) == (512, 9001, "-secret-", -1)


def test_environment_then_command_line() -> None:
    env = {"LLAMA_ARG_CTX_SIZE": "1024", "KINETIC_PORT": "9000", "LLAMA_ARG_PORT": "1", "LLAMA_ARG_EMBEDDINGS": "true"}
    s = parse_serve_args(["--port", "9100"], environ=env)
    assert s.ctx_size == 1024 and s.port == 9100 and s.embeddings is True
    assert parse_serve_args([], environ=env).port == 9000  # KINETIC_* before LLAMA_ARG_*


def test_llama_server_boolean_variables() -> None:
    assert parse_serve_args([], environ={"LLAMA_ARG_NO_JINJA": "1"}).jinja is False
    assert parse_serve_args([], environ={"LLAMA_ARG_ENDPOINT_METRICS": "enabled"}).metrics is True
    assert parse_serve_args([], environ={"KINETIC_SLOTS": "off"}).slots is False


def test_settings_object_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KINETIC_PORT", "9999")
    monkeypatch.setenv("LLAMA_ARG_PORT", "9998")
    assert ServerSettings().port == 8080 and ServerSettings(port=1).port == 1


def test_batch_sizes_default_to_llama_servers() -> None:
    s = parse_serve_args([], environ={})
    assert (s.batch_size, s.ubatch_size) == (2048, 512)
    s = parse_serve_args(["-b", "256", "--ubatch-size", "64"], environ={})
    assert (s.batch_size, s.ubatch_size, s.ignored_flags) == (256, 64, ())
    s = parse_serve_args([], environ={"LLAMA_ARG_BATCH": "128", "LLAMA_ARG_UBATCH": "32"})
    assert (s.batch_size, s.ubatch_size) == (128, 32)


UNIMPLEMENTED = sorted(spelling for spelling, flag in by_spelling().items() if spelling not in FLAGS_BY_SPELLING
                       and spelling not in ("-h", "--help", "--usage", "--version"))


@pytest.mark.parametrize("spelling", UNIMPLEMENTED)
def test_every_other_llama_server_flag_is_accepted_with_its_values(spelling: str) -> None:
    """Switches take nothing (`-kvu model.gguf`), value flags take exactly their values."""
    values = ["-7"] * by_spelling()[spelling].values  # a value that looks like a flag is still the value
    s = parse_serve_args([spelling, *values, "model.gguf", "-c", "512"], environ={})
    assert s.model == "model.gguf" and s.ctx_size == 512 and s.ignored_flags == (spelling,)


def test_issue_examples_start() -> None:
    argv = ["-kvu", "model.gguf", "-sps", "0.5", "-r", "User:", "--keep", "-1", "-ot", "exps=CPU", "--override-kv",
            "tokenizer.ggml.add_bos_token=bool:false", "--dry-multiplier", "0.8", "--dry-sequence-breaker", "none",
            "--xtc-probability", "0.5", "--xtc-threshold", "0.1", "-ngl", "99", "-fa", "on", "--mlock",
            "--control-vector-layer-range", "1", "10", "--no-webui", "-np", "2"]
    s = parse_serve_args(argv, environ={})
    assert s.model == "model.gguf" and s.parallel == 2 and s.ui is False  # --no-webui is kinetic's --no-ui
    assert s.ignored_flags == () and s.keep == -1 and s.long_context().slot_similarity == 0.5
    assert s.control_vector_layer_range == "1 10"  # its two values, then -np 2 read as a flag again
    assert s.override_tensor == ("exps=CPU",)
    assert s.kv_unified and s.reverse_prompt == ("User:",)
    assert s.override_kv == ("tokenizer.ggml.add_bos_token=bool:false",)
    assert (s.dry_multiplier, s.dry_sequence_breaker, s.xtc_probability, s.xtc_threshold) == (0.8, ("none",), 0.5, 0.1)
    assert (s.gpu_layers, s.flash_attn, s.mlock) == ("99", "on", True)


def test_unimplemented_variables_are_reported() -> None:
    s = parse_serve_args([], environ={"LLAMA_ARG_VIDEO_FPS": "2", "LLAMA_ARG_NO_CONT_BATCHING": "1",
                                      "LLAMA_ARG_PORT": "9000", "LLAMA_ARG_THREADS_HTTP": ""})
    assert s.ignored_env == ("LLAMA_ARG_NO_CONT_BATCHING", "LLAMA_ARG_VIDEO_FPS") and s.port == 9000
    s = parse_serve_args([], environ={"LLAMA_ARG_N_GPU_LAYERS": "99", "LLAMA_ARG_NO_KV_OFFLOAD": "1"})
    assert not s.ignored_env and s.gpu_layers == "99" and s.kv_offload is False
    s = parse_serve_args([], environ={"KINETIC_PROT": "9000", "KINETIC_CACHE_DIR": "/tmp/k", "KINETIC_PORT": "1"})
    assert s.ignored_env == ("KINETIC_PROT",) and s.port == 1


def test_help_and_version_are_actions() -> None:
    for argv in (["-m", "x.gguf", "--help"], ["--usage"], ["-h", "--port", "abc"]):  # no value is checked
        with pytest.raises(InfoRequested) as asked:
            parse_serve_args(argv, environ={})
        assert asked.value.text == help_text()
    with pytest.raises(InfoRequested) as asked:
        parse_serve_args(["--version"], environ={})
    assert asked.value.text == f"kinetic {__version__}"
    assert parse_serve_args(["--api-key", "--help"], environ={}).api_key == "--help"  # a value, not the flag


def test_main_serves_what_parse_serve_args_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """main() runs the very function the tests call: what it hands to serve() is parse_serve_args's."""
    import kinetic.cli

    served: list[ServerSettings] = []
    monkeypatch.setattr(kinetic.cli, "serve", lambda settings: served.append(settings) or 0)
    argv = ["a.gguf", "-a", "x", "-hf", "org/repo:Q8_0", "-r", "A:", "-r", "B:", "--no-jinja", "--video-fps", "2"]
    assert main(["serve", *argv]) == 0
    assert served == [parse_serve_args(argv)]
    assert served[0].model_args == (("a.gguf", "x"), ("hf:org/repo:Q8_0", None))
    assert served[0].reverse_prompt == ("A:", "B:") and served[0].ignored_flags == ("--video-fps",)


BAD = [
    (["--port", "abc"], {}, "invalid value 'abc' for --port: expected an integer"),
    (["--port", "70000"], {}, "invalid value '70000' for --port: must be <= 65535"),
    ([], {"KINETIC_PORT": "abc"}, "invalid value 'abc' for KINETIC_PORT: expected an integer"),
    ([], {"LLAMA_ARG_PORT": "x"}, "invalid value 'x' for LLAMA_ARG_PORT: expected an integer"),
    (["-np", "0"], {}, "invalid value '0' for -np: expected -1 (auto) or a number of slots >= 1"),
    (["-c", "-5"], {}, "invalid value '-5' for -c: must be >= 0"),
    (["--temp", "hot"], {}, "invalid value 'hot' for --temp: expected a number"),
    (["-b", "0"], {}, "invalid value '0' for -b: must be >= 1"),
    ([], {"LLAMA_ARG_UBATCH": "many"}, "invalid value 'many' for LLAMA_ARG_UBATCH: expected an integer"),
    (["--chat-template-kwargs", "{bad"], {}, "invalid value '{bad' for --chat-template-kwargs: not valid JSON"),
    (["--chat-template-kwargs", "[1]"], {}, "for --chat-template-kwargs: expected a JSON object"),
    ([], {"LLAMA_ARG_CHAT_TEMPLATE_KWARGS": "nope"}, "for LLAMA_ARG_CHAT_TEMPLATE_KWARGS: not valid JSON"),
    (["--reasoning-format", "r1"], {}, "invalid value 'r1' for --reasoning-format: expected one of: none, auto, "
                                       "deepseek or deepseek-legacy"),
    ([], {"LLAMA_ARG_THINK": "r1"}, "invalid value 'r1' for LLAMA_ARG_THINK: expected one of"),
    ([], {"KINETIC_METRICS": "maybe"}, "invalid value 'maybe' for KINETIC_METRICS: expected on/off"),
    (["--body-timeout", "0"], {}, "invalid value '0' for --body-timeout: must be > 0"),
    (["-hf", "just-a-name"], {}, "invalid value 'just-a-name' for -hf: expected <user>/<model>[:quant]"),
    (["--chat-template-file", "/no/such/template.jinja"], {},
     "invalid value '/no/such/template.jinja' for --chat-template-file: no such file"),
    ([], {"LLAMA_ARG_API_KEY_FILE": "/no/such/keys.txt"}, "for LLAMA_ARG_API_KEY_FILE: no such file"),
    (["--api-key-file", "/"], {}, "invalid value '/' for --api-key-file: not a file"),
    (["--chat-template", "chatlm"], {}, "invalid value 'chatlm' for --chat-template: expected a built-in template "
                                        "name (chatml, gemma, llama3, bailing, "),
    (["--frobnicate"], {}, "unknown flag --frobnicate (neither kinetic nor llama-server has it)"),
    (["--ctx", "512"], {}, "did you mean --ctx-size?"),
    (["-c"], {}, "-c expects a value (N)"),
    (["--control-vector-layer-range", "1"], {}, "--control-vector-layer-range expects a value"),
    (["--metrics=no"], {}, "--metrics takes no value"),
    (["a.gguf", "b.gguf"], {}, "unexpected argument(s): b.gguf"),
]


@pytest.mark.parametrize(("argv", "environ", "message"), BAD, ids=[" ".join(a) or next(iter(e)) for a, e, _ in BAD])
def test_bad_values_name_the_flag_or_variable(argv: list[str], environ: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        parse_serve_args(argv, environ=environ)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_cli_exit_code_2_and_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KINETIC_PORT", "abc")
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err == "error: invalid value 'abc' for KINETIC_PORT: expected an integer\n"
    monkeypatch.delenv("KINETIC_PORT")
    assert main(["serve", "--reasoning-format", "r1", "--chat-template-kwargs", "{"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all(line.startswith("error: invalid value") for line in lines)


def test_serve_help_is_readable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in FLAGS:
        assert flag.names[0] in out and flag.kinetic_env in out
    assert "--rpc" in out and "accepted" in out and "ignored" in out  # the other flags are listed by reason
    assert len(llama_server_flags()) > 200


def test_template_names_and_files_that_exist_are_taken(tmp_path) -> None:
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}")
    s = parse_serve_args(["--chat-template", "chatml", "--chat-template-file", str(template)], environ={})
    assert (s.chat_template, s.chat_template_file) == ("chatml", str(template))
    assert parse_serve_args(["--chat-template", "{% for m in messages %}{% endfor %}"], environ={}).chat_template


def test_api_keys_from_flag_and_file(tmp_path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("# class keys\nalpha\n\nbeta\n")
    s = parse_serve_args(["--api-key", "k1,k2", "--api-key-file", str(keys)], environ={})
    assert s.api_keys() == ("k1", "k2", "alpha", "beta")
    keys.write_text("# class keys\nalpha ann\nbeta  # no name\n")
    assert s.api_keys() == ("k1", "k2", "alpha", "beta") and s.key_ring().name_for("alpha") == "ann"


def test_cli_reference_page_names_every_flag() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "cli.md").read_text()
    missing = [flag.names[0] for flag in FLAGS if f"`{flag.names[0]}" not in page and f" {flag.names[0]}" not in page]
    assert not missing


def test_host_takes_a_comma_list_and_port_0_needs_one_address() -> None:
    from kinetic.cli import bind_sockets

    s = parse_serve_args(["--host", "127.0.0.1, ::1", "--tags", "chat,fim"], environ={"LLAMA_ARG_HOST": "192.0.2.1"})
    assert s.hosts == ("127.0.0.1", "::1") and s.tags == "chat,fim"
    with pytest.raises(OSError, match="--port 0 is not supported with several addresses"):
        bind_sockets(s.hosts, 0)
    (sock,) = bind_sockets(("127.0.0.1",), 0)
    sock.close()


def test_tools_agent_and_the_proxy_flags_are_read() -> None:
    s = parse_serve_args(["--tools", "all", "--ui-mcp-proxy"], environ={})
    assert s.tools == "all" and s.cors_proxy and s.cors_policy == "localhost" and not s.ignored_flags
    assert parse_serve_args(["-ag"], environ={}).cors_proxy
    assert parse_serve_args([], environ={"LLAMA_ARG_TOOLS": "read_file"}).cors_policy == "localhost"
