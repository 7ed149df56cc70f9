"""Regenerate kinetic/config/llama_server_flags.json: llama-server's flag table, read from llama.cpp's source.

    python scripts/gen_llama_server_flags.py [SDIST_OR_ARG_CPP]

The source is `vendor/llama.cpp/common/arg.cpp` inside the llama-cpp-python sdist that kinetic pins
(fetched with `pip download` when no path is given). Each `add_opt(common_arg(...))` in
`common_params_parser_init()` becomes one row when llama-server (LLAMA_EXAMPLE_SERVER) would register
it: tagged for the server or for every example (LLAMA_EXAMPLE_COMMON), and not excluded from it.
The constructor's shape says how the flag reads its value, exactly as the parser in arg.cpp does:
a void handler is a switch, a bool handler is a switch with `--no-...` spellings, a string or int
handler takes one value, a string-string handler takes two.
tests/unit/test_llama_server_flags.py runs this parser on the same sdist and compares.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE_PATH = ROOT / "kinetic" / "llama_server_flags.json"
ARG_CPP_MEMBER = "vendor/llama.cpp/common/arg.cpp"
SERVER = "LLAMA_EXAMPLE_SERVER"
COMMON = "LLAMA_EXAMPLE_COMMON"


class ArgCppError(ValueError):
    """arg.cpp holds a construct this reader does not know: fail loudly rather than drop flags."""


def pinned_version() -> str:
    """The llama-cpp-python version pyproject.toml pins (`llama-cpp-python==X`)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'"llama-cpp-python==([^"]+)"', text)
    if not match:
        raise SystemExit("pyproject.toml does not pin llama-cpp-python==X")
    return match.group(1)


def download_sdist(version: str, dest: Path) -> Path:
    """The sdist from PyPI through pip (pip's HTTP cache makes a second call cheap)."""
    name = f"llama_cpp_python-{version}.tar.gz"
    if (dest / name).exists():
        return dest / name
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    f"llama-cpp-python=={version}", "-d", str(dest)], check=True,
                   stdout=subprocess.DEVNULL)
    return dest / name


def read_arg_cpp(source: Path) -> str:
    """arg.cpp's text from an sdist tarball or from the file itself."""
    if source.name.endswith(".tar.gz"):
        with tarfile.open(source) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith(ARG_CPP_MEMBER))
            handle = tar.extractfile(member)
            assert handle is not None
            return handle.read().decode("utf-8")
    return source.read_text(encoding="utf-8")


# --- a small C++ reader: strings, comments and balanced brackets are all it needs -------------

def _skip_literal(text: str, i: int) -> int:
    """Index just past the string or char literal starting at i (raw strings included)."""
    if text.startswith('R"', i):
        delim_end = text.index("(", i)
        delim = text[i + 2:delim_end]
        return text.index(f"){delim}\"", delim_end) + len(delim) + 2
    quote = text[i]
    i += 1
    while text[i] != quote:
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _next_token_end(text: str, i: int) -> int:
    """Index past a comment or literal at i, or i itself when there is none."""
    if text.startswith("//", i):
        return text.index("\n", i)
    if text.startswith("/*", i):
        return text.index("*/", i) + 2
    if text[i] in "\"'" or text.startswith('R"', i) and not text[i - 1].isalnum():
        return _skip_literal(text, i)
    return i


def strip_comments(text: str) -> str:
    """The text with every comment replaced by a space (literals kept, so URLs survive)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        end = _next_token_end(text, i)
        if end == i:
            out.append(text[i])
            i += 1
            continue
        out.append(" " if text.startswith(("//", "/*"), i) else text[i:end])
        i = end
    return "".join(out)


def matching_close(text: str, open_index: int) -> int:
    """Index of the bracket closing the one at open_index."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack = [pairs[text[open_index]]]
    i = open_index + 1
    while stack:
        end = _next_token_end(text, i)
        if end != i:
            i = end
            continue
        ch = text[i]
        if ch in pairs:
            stack.append(pairs[ch])
        elif ch in ")}]":
            if ch != stack.pop():
                raise ArgCppError(f"unbalanced {ch!r} at offset {i}")
        i += 1
    return i - 1


def split_top_level(text: str) -> list[str]:
    """Split a call's argument text on the commas that are not nested in brackets or literals."""
    parts: list[str] = []
    depth = 0
    start = 0
    i = 0
    while i < len(text):
        end = _next_token_end(text, i)
        if end != i:
            i = end
            continue
        ch = text[i]
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
        i += 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


def string_literals(text: str) -> list[str]:
    return [json.loads(m) for m in re.findall(r'"(?:[^"\\]|\\.)*"', text)]


def brace_list(text: str, named: dict[str, list[str]] | None = None) -> list[str]:
    """`{A, B}`, or the name of a static initializer list defined in the file (mmproj_examples)."""
    if named and text in named:
        return named[text]
    if not (text.startswith("{") and text.endswith("}")):
        raise ArgCppError(f"expected an initializer list, got {text[:60]!r}")
    return [p.strip() for p in split_top_level(text[1:-1])]


# --- the flag table -------------------------------------------------------------------------

def parser_init_body(text: str) -> str:
    start = text.index("common_params_context common_params_parser_init(")
    open_brace = text.index("{", text.index(")", start))
    return text[open_brace + 1:matching_close(text, open_brace)]


def server_statements(body: str) -> list[str]:
    """The body's add_opt(...) calls that run for llama-server, walking `if (ex == ...)` branches."""
    calls: list[str] = []
    i = 0
    while i < len(body):
        end = _next_token_end(body, i)
        if end != i:
            i = end
            continue
        if body.startswith("add_opt(", i) and not body[i - 1].isalnum():
            open_paren = i + len("add_opt")
            close = matching_close(body, open_paren)
            calls.append(body[open_paren + 1:close])
            i = close + 1
            continue
        if body.startswith("if (", i) and not body[i - 1].isalnum():
            i = _walk_if(body, i, calls)
            continue
        if body[i] == "{":  # lambdas and other blocks: skip whole (add_opt inside one is not expected)
            close = matching_close(body, i)
            if "add_opt(" in body[i:close]:
                raise ArgCppError(f"add_opt inside an unknown block at offset {i}")
            i = close + 1
            continue
        i += 1
    return calls


def _server_condition(condition: str) -> bool:
    """Evaluate `ex == X || ex == Y` (and `!=`) for llama-server; anything else is unknown."""
    result = False
    for clause in condition.split("||"):
        match = re.fullmatch(r"\s*ex\s*(==|!=)\s*(LLAMA_EXAMPLE_\w+)\s*", clause)
        if not match:
            raise ArgCppError(f"unknown condition around add_opt: {condition!r}")
        equal = match.group(2) == SERVER
        result = result or (equal if match.group(1) == "==" else not equal)
    return result


def _walk_if(body: str, i: int, calls: list[str]) -> int:
    """Follow an if / else if / else chain; add the add_opt calls of the branch llama-server takes."""
    taken = False
    while True:
        cond_open = body.index("(", i)
        cond_close = matching_close(body, cond_open)
        block_open = body.index("{", cond_close)
        block_close = matching_close(body, block_open)
        block = body[block_open + 1:block_close]
        if "add_opt(" in block:
            if not taken and _server_condition(body[cond_open + 1:cond_close]):
                taken = True
                calls.extend(server_statements(block))
        else:
            taken = True  # a branch without options (per-example defaults): nothing to evaluate
        i = block_close + 1
        rest = body[i:].lstrip()
        if rest.startswith("else if"):
            i = body.index("else if", i) + len("else ")
            continue
        if rest.startswith("else"):
            else_open = body.index("{", i)
            else_close = matching_close(body, else_open)
            if not taken:
                calls.extend(server_statements(body[else_open + 1:else_close]))
            return else_close + 1
        return i


def named_example_lists(arg_cpp: str) -> dict[str, list[str]]:
    """`static std::initializer_list<enum llama_example> NAME = {...};` definitions."""
    pattern = re.compile(r"static\s+std::initializer_list<enum llama_example>\s+(\w+)\s*=\s*(\{[^}]*\})")
    return {m.group(1): brace_list(m.group(2)) for m in pattern.finditer(arg_cpp)}


def flag_row(call: str, named: dict[str, list[str]]) -> dict | None:
    """One table row from an add_opt argument `common_arg(...).set_x(...)...`, or None off the server."""
    if not call.startswith("common_arg("):
        raise ArgCppError(f"add_opt of something other than common_arg: {call[:60]!r}")
    ctor_close = matching_close(call, len("common_arg"))
    ctor = split_top_level(call[len("common_arg") + 1:ctor_close])
    examples = {COMMON}
    excludes: set[str] = set()
    env = None
    kind_marks: set[str] = set()
    for method in re.finditer(r"\.(set_\w+)\(", call[ctor_close + 1:]):
        open_paren = ctor_close + 1 + method.end() - 1
        argument = call[open_paren + 1:matching_close(call, open_paren)].strip()
        name = method.group(1)
        if name == "set_examples":
            examples = set(brace_list(argument, named))
        elif name == "set_excludes":
            excludes = set(brace_list(argument, named))
        elif name == "set_env":
            literals = string_literals(argument)
            if len(literals) != 1:
                raise ArgCppError(f"set_env without a literal name: {argument!r}")
            env = literals[0]
        elif name in ("set_sampling", "set_spec", "set_preset_only"):
            kind_marks.add(name)
        else:
            raise ArgCppError(f"unknown common_arg method {name}")
    if SERVER in excludes or not ({SERVER, COMMON} & examples) or "set_preset_only" in kind_marks:
        return None
    names = string_literals(ctor[0])
    negations: list[str] = []
    hint = None
    if len(ctor) == 3:
        kind = "switch"  # (args, help, void handler)
    elif len(ctor) == 4 and ctor[1].startswith("{"):
        kind = "switch"  # (args, args_neg, help, bool handler)
        negations = string_literals(ctor[1])
    elif len(ctor) == 4:
        kind = "value"  # (args, value_hint, help, string or int handler)
        hint = next(iter(string_literals(ctor[1])), None)
    elif len(ctor) == 5:
        kind = "value2"  # (args, value_hint, value_hint_2, help, string-string handler)
        hint = " ".join(string_literals(ctor[1]) + string_literals(ctor[2]))
    else:
        raise ArgCppError(f"common_arg with {len(ctor)} arguments: {names}")
    if not names:
        raise ArgCppError(f"common_arg without literal names: {ctor[0]!r}")
    return {"names": names, "negations": negations, "kind": kind, "value_hint": hint, "env": env,
            "sampling": "set_sampling" in kind_marks}


def server_flags(arg_cpp: str) -> list[dict]:
    """Every flag llama-server accepts, in arg.cpp's order; a later add_opt of a name replaces it."""
    rows: dict[str, dict] = {}
    arg_cpp = strip_comments(arg_cpp)
    named = named_example_lists(arg_cpp)
    for call in server_statements(parser_init_body(arg_cpp)):
        row = flag_row(call, named)
        if row is not None:
            for name in row["names"]:
                rows.pop(name, None)
            rows[row["names"][0]] = row
    return list(rows.values())


def build_table(arg_cpp: str, version: str) -> dict:
    return {"source": f"llama-cpp-python {version} sdist, {ARG_CPP_MEMBER}", "llama_cpp_python": version,
            "flags": server_flags(arg_cpp)}


def write_table(table: dict, path: Path = TABLE_PATH) -> None:
    rows = ",\n".join("    " + json.dumps(row, ensure_ascii=False) for row in table["flags"])
    head = {k: v for k, v in table.items() if k != "flags"}
    text = json.dumps(head, indent=2)[:-2] + ',\n  "flags": [\n' + rows + "\n  ]\n}\n"
    path.write_text(text, encoding="utf-8")


def main(argv: list[str]) -> int:
    version = pinned_version()
    if argv:
        source = Path(argv[0])
    else:
        source = download_sdist(version, Path.home() / ".cache" / "kinetic" / "sdist")
    table = build_table(read_arg_cpp(source), version)
    write_table(table)
    print(f"{TABLE_PATH.relative_to(ROOT)}: {len(table['flags'])} llama-server flags from {source.name}")
    installed = metadata.version("llama-cpp-python") if _installed() else None
    if installed and installed != version:
        print(f"note: installed llama-cpp-python is {installed}, the pin is {version}", file=sys.stderr)
    return 0


def _installed() -> bool:
    try:
        metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return False
    return True


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
