"""The committed llama-server flag table matches llama.cpp's arg.cpp, and the reader of arg.cpp is right."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

from kinetic.config.llama_flags import by_spelling, llama_server_flags, table

ROOT = Path(__file__).resolve().parents[2]


def load_generator():
    path = ROOT / "scripts" / "gen_llama_server_flags.py"
    spec = importlib.util.spec_from_file_location("gen_llama_server_flags", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = load_generator()


@pytest.fixture(scope="session")
def sdist(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pinned llama-cpp-python sdist: KINETIC_LLAMA_SDIST, else fetched once from PyPI with pip.

    Never skipped: without the sdist the table cannot be checked, and that is a failure to see.
    """
    if override := os.environ.get("KINETIC_LLAMA_SDIST"):
        return Path(override)
    # kept between runs in .pytest_cache: one download, then none
    if getattr(request.config, "cache", None) is not None:
        cache = Path(request.config.cache.mkdir("llama-cpp-python-sdist"))
    else:
        cache = tmp_path_factory.mktemp("llama-cpp-python-sdist")
    try:
        return gen.download_sdist(gen.pinned_version(), cache)
    except subprocess.CalledProcessError as exc:
        pytest.fail(f"could not fetch the llama-cpp-python sdist with pip ({exc}); set KINETIC_LLAMA_SDIST to "
                    "its path to check the flag table")


def test_table_matches_the_vendored_arg_cpp(sdist: Path) -> None:
    expected = gen.build_table(gen.read_arg_cpp(sdist), gen.pinned_version())
    assert table() == expected, "kinetic/config/llama_server_flags.json is stale: run scripts/gen_llama_server_flags.py"


def test_table_is_for_the_pinned_and_installed_llama_cpp_python() -> None:
    assert table()["llama_cpp_python"] == gen.pinned_version() == metadata.version("llama-cpp-python")


def test_table_holds_the_flags_the_issue_names() -> None:
    flags = by_spelling()
    for spelling, values in {"-kvu": 0, "-no-kvu": 0, "-sps": 1, "-r": 1, "--keep": 1, "-ot": 1,
                             "--override-kv": 1, "--dry-multiplier": 1, "--xtc-probability": 1, "-ngl": 1,
                             "--control-vector-layer-range": 2, "--no-webui": 0, "-b": 1, "-ub": 1}.items():
        assert flags[spelling].values == values, spelling
    # older llama-server switches, gone from this llama.cpp (--load-mode), are still known as switches
    assert not any("--mlock" in flag.names for flag in llama_server_flags()) and flags["--mlock"].values == 0
    assert flags["-b"].env == "LLAMA_ARG_BATCH" and flags["-ub"].env == "LLAMA_ARG_UBATCH"
    assert flags["--jinja"].negative_env == "LLAMA_ARG_NO_JINJA"
    assert len(llama_server_flags()) > 200


# --- the arg.cpp reader on small, known inputs ---------------------------------------------------

PARSER_INIT = """
static std::initializer_list<enum llama_example> mm_examples = {
    LLAMA_EXAMPLE_MTMD, LLAMA_EXAMPLE_SERVER };
common_params_context common_params_parser_init(common_params & params, llama_example ex, void(*usage)(int, char **)) {
    if (ex == LLAMA_EXAMPLE_COMPLETION) {
        params.use_jinja = false;
    }
    auto add_opt = [&](common_arg arg) {
        if (arg.in_example(ex)) { ctx_arg.options.push_back(std::move(arg)); }
    };
    add_opt(common_arg(
        {"-sw", "--switch"},
        "a switch (default: \\"{x}\\")",
        [](common_params & params) { params.x = true; }
    ));
    add_opt(common_arg(
        // a comment with {"--not-a-flag"} and a brace {
        {"-bo", "--bool"}, {"-no-bo", "--no-bool"},
        string_format("bool (default: %s)", "x, y"),
        [](common_params & params, bool value) { params.y = value; }
    ).set_env("LLAMA_ARG_BOOL"));
    add_opt(common_arg(
        {"-v1", "--value"}, "N",
        "one value",
        [](common_params & params, int value) { params.n = value; }
    ).set_examples({LLAMA_EXAMPLE_SERVER}).set_sampling());
    add_opt(common_arg(
        {"--two"}, "A", "B",
        "two values",
        [](common_params & params, const std::string & a, const std::string & b) { }
    ));
    add_opt(common_arg(
        {"--cli-only"}, "X",
        "not for the server",
        [](common_params & params, const std::string & value) { }
    ).set_examples({LLAMA_EXAMPLE_CLI}));
    add_opt(common_arg(
        {"--not-server"},
        "excluded",
        [](common_params & params) { }
    ).set_excludes({LLAMA_EXAMPLE_SERVER}));
    add_opt(common_arg(
        {"--mm"}, "FILE",
        "named example list",
        [](common_params & params, const std::string & value) { }
    ).set_examples(mm_examples));
    if (ex == LLAMA_EXAMPLE_SERVER) {
        add_opt(common_arg({"-np"}, "N", "server slots", [](common_params & p, int v) { }).set_env("LLAMA_ARG_NP"));
    } else {
        add_opt(common_arg({"-np"}, "N", "sequences", [](common_params & p, int v) { }));
    }
    return ctx_arg;
}
"""


def test_reader_kinds_examples_and_branches() -> None:
    rows = {row["names"][0]: row for row in gen.server_flags(PARSER_INIT)}
    assert list(rows) == ["-sw", "-bo", "-v1", "--two", "--mm", "-np"]
    assert rows["-sw"]["kind"] == "switch" and rows["-sw"]["negations"] == []
    assert rows["-bo"] == {"names": ["-bo", "--bool"], "negations": ["-no-bo", "--no-bool"], "kind": "switch",
                           "value_hint": None, "env": "LLAMA_ARG_BOOL", "sampling": False}
    assert rows["-v1"]["kind"] == "value" and rows["-v1"]["value_hint"] == "N" and rows["-v1"]["sampling"]
    assert rows["--two"]["kind"] == "value2" and rows["--two"]["value_hint"] == "A B"
    assert rows["-np"]["env"] == "LLAMA_ARG_NP"  # the server branch, not the else branch


def test_reader_refuses_what_it_does_not_know() -> None:
    unknown_condition = PARSER_INIT.replace("if (ex == LLAMA_EXAMPLE_SERVER)", "if (params.foo)")
    with pytest.raises(gen.ArgCppError, match="unknown condition"):
        gen.server_flags(unknown_condition)
    unknown_method = PARSER_INIT.replace(".set_sampling()", ".set_something()")
    with pytest.raises(gen.ArgCppError, match="set_something"):
        gen.server_flags(unknown_method)
