"""Which of llama-server's flags act in kinetic, and why each other one is ignored.

One table, read by `kinetic serve --help`, the start-up warning, docs/reference/cli.md (its flag list is
generated from here by scripts/gen_cli_reference.py) and the tests. Each reason is a row of the
"Differences from llama-server" table in docs/reference/http-llamacpp.md; the warning names that row.
"""

from __future__ import annotations

from dataclasses import dataclass

from kinetic.config.flags import FLAGS_BY_SPELLING
from kinetic.config.llama_flags import LlamaFlag, llama_server_flags

CLI_ACTIONS = ("-h", "--version")  # handled by the command line itself: help, version
DIFFERENCES_PAGE = "docs/reference/http-llamacpp.md"


@dataclass(frozen=True)
class Ignored:
    """Flags kinetic accepts and ignores for one reason: `row` names their row in the differences table."""

    row: str
    why: str
    flags: tuple[str, ...]  # each flag by its first spelling in llama-server's table


IGNORED: tuple[Ignored, ...] = (
    Ignored("ignored flags: video input and the encoder's batch",
            "kinetic's multimodal input is images and audio through the model's projector (-mm, or the one -hf "
            "finds); video split into frames with ffmpeg (--video-*) and the limit on image tokens encoded in one "
            "batch (--mtmd-batch-max-tokens) are not implemented",
            ("--mtmd-batch-max-tokens", "--video-fps", "--video-timestamp-interval", "--video-ffmpeg-dir")),
    Ignored("ignored flags: lookup cache files, ngram-simple's min hits, --spec-default",
            "kinetic runs every n-gram kind of --spec-type (ngram-simple, ngram-map-k, ngram-map-k4v, ngram-mod, "
            "ngram-cache) and draft-simple, each with the --spec-ngram-* sizes given; ngram-cache counts the "
            "slot's own tokens only (no static or dynamic cache files, -lcs/-lcd); --spec-default (ngram-mod with "
            "its sizes) is not read; the draft heads (draft-eagle3, draft-mtp, draft-dflash, draft-dspark) are "
            "accepted by --spec-type with a warning and not run; --spec-ngram-simple-min-hits does nothing in "
            "llama-server's ngram-simple either",
            ("-lcs", "-lcd", "--spec-ngram-simple-min-hits", "--spec-default")),
    Ignored("ignored flags: draft model placement",
            "the draft model (-md) runs on the CPU with the main model's threads and KV cache types, sampled in "
            "Python, in the same decode thread; -hfd downloads are not offered (give -md a file); "
            "--spec-draft-p-split is read by no kind kinetic runs",
            ("--spec-draft-hf", "--spec-draft-threads", "--spec-draft-threads-batch", "--spec-draft-cpu-mask",
             "--spec-draft-cpu-range", "--spec-draft-cpu-strict", "--spec-draft-prio", "--spec-draft-poll",
             "--spec-draft-cpu-mask-batch", "--spec-draft-cpu-strict-batch", "--spec-draft-prio-batch",
             "--spec-draft-poll-batch", "--spec-draft-type-k", "--spec-draft-type-v", "--spec-draft-override-tensor",
             "--spec-draft-cpu-moe", "--spec-draft-n-cpu-moe", "--spec-draft-p-split", "--spec-draft-backend-sampling",
             "--spec-draft-device", "--spec-draft-ngl")),
    Ignored("ignored flags: removed from llama-server",
            "the vendored llama-server refuses them at start (\"the argument has been removed\"); kinetic accepts "
            "and ignores them, use --spec-ngram-simple-size-n/-m",
            ("--spec-ngram-size-n", "--spec-ngram-size-m", "--spec-ngram-min-hits")),
    Ignored("ignored flags: checkpoint spacing",
            "kinetic saves at most three checkpoints per prompt (4 tokens before its end, where its last message "
            "starts, where it parts from the longest prompt seen before it) in the shared --cache-ram cache, "
            "least recently used out first, so there is no run of per-message checkpoints for a minimum spacing "
            "to thin out",
            ("-cms",)),
    Ignored("ignored flags: remote devices and fitting to memory",
            "--rpc needs ggml's RPC backend, which kinetic's llama-cpp-python build leaves out; --fit and its "
            "targets are llama_params_fit, part of llama.cpp's common library, not of the libllama that "
            "llama-cpp-python binds, so kinetic takes -c, -ngl and the rest as given",
            ("--rpc", "-fit", "-fitt", "-fitc")),
    Ignored("ignored flags: model downloads other than -hf",
            "kinetic downloads from the Hugging Face hub only (-hf), the one network source a classroom allows; "
            "the presets download a set model: give -hf and its flags instead",
            ("-mu", "-dr", "--embd-gemma-default", "--fim-qwen-1.5b-default", "--fim-qwen-3b-default",
             "--fim-qwen-7b-default", "--fim-qwen-7b-spec", "--fim-qwen-14b-spec", "--fim-qwen-30b-default",
             "--gpt-oss-20b-default", "--gpt-oss-120b-default", "--vision-gemma-4b-default",
             "--vision-gemma-12b-default")),
    Ignored("ignored flags: llama-server internals",
            "what they switch is fixed in kinetic: batching is always continuous, "
            "KV defragmentation is automatic (deprecated in llama-server too), agent tools run nowhere "
            "(see the --tools row), and there is no shell completion or cache listing",
            ("-cb", "-dt", "--tools-runtime", "--mcp-servers-config",
             "--mcp-servers-json", "-cl", "--completion-bash")),
)


def _first(flag: LlamaFlag) -> str:
    return flag.names[0]


def acts(flag: LlamaFlag) -> bool:
    """Wired to a setting kinetic uses, or handled by the command line (help, version)."""
    spellings = {*flag.names, *flag.negations}
    return bool(spellings & set(FLAGS_BY_SPELLING)) or flag.names[0] in CLI_ACTIONS


def acting_flags() -> tuple[LlamaFlag, ...]:
    return tuple(flag for flag in llama_server_flags() if acts(flag))


def ignored_by_flag() -> dict[str, Ignored]:
    """First spelling -> its reason."""
    return {name: reason for reason in IGNORED for name in reason.flags}


def reason_for(spelling: str) -> Ignored | None:
    """The reason a spelling (any of a flag's) is ignored, or None when it acts or is unknown."""
    table = ignored_by_flag()
    for flag in llama_server_flags():
        if spelling in (*flag.names, *flag.negations):
            return table.get(_first(flag))
    return None


def variable_warning(name: str) -> str:
    """The start-up line for a set variable that sets nothing."""
    if name.startswith("KINETIC_"):
        return f"warning: {name} is not a kinetic setting; ignored"
    flag = next((f for f in llama_server_flags() if name in (f.env, f.negative_env)), None)
    reason = ignored_by_flag().get(_first(flag)) if flag is not None else None
    if flag is None or reason is None:
        return f"warning: {name} is a llama-server variable kinetic does not implement; ignored"
    return (f"warning: {name} ({_first(flag)}) is ignored: see \"{reason.row}\" under Differences from "
            f"llama-server ({DIFFERENCES_PAGE})")


def warning(spelling: str) -> str:
    """The start-up line for an ignored flag: what it is and the row that says why."""
    reason = reason_for(spelling)
    if reason is None:
        return f"warning: {spelling} is a llama-server flag kinetic does not implement; ignored"
    return (f"warning: {spelling} is ignored: see \"{reason.row}\" under Differences from llama-server "
            f"({DIFFERENCES_PAGE})")


TABLE_START = "<!-- flag table: generated by scripts/gen_cli_reference.py from kinetic/config/flag_status.py -->"
TABLE_END = "<!-- end of the flag table -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def reference_table() -> str:
    """docs/reference/cli.md's list of every llama-server flag: acts, or ignored and why."""
    reasons = ignored_by_flag()
    rows = [TABLE_START, "", "| llama-server flag | in kinetic | what it does, or why it is ignored |", "|---|---|---|"]
    for flag in llama_server_flags():
        spellings = ", ".join(f"`{name}`" for name in (*flag.names, *flag.negations))
        if acts(flag):
            own = next((FLAGS_BY_SPELLING[n] for n in (*flag.names, *flag.negations) if n in FLAGS_BY_SPELLING), None)
            what = own.help if own is not None else ("this help" if flag.names[0] == "-h" else "print the version")
            rows.append(f"| {spellings} | acts | {_cell(what)} |")
        else:
            reason = reasons[_first(flag)]
            rows.append(f"| {spellings} | ignored | {_cell(reason.row.removeprefix('ignored flags: '))}: "
                        f"{_cell(reason.why)} |")
    rows += ["", TABLE_END]
    return "\n".join(rows)


DIFFERENCES_TEST = "tests/unit/test_flag_status.py::test_ignored_flags_warn_naming_their_row"


def difference_rows() -> list[str]:
    """One row of the differences table per reason kinetic ignores flags for."""
    return [f"| {reason.row} ({len(reason.flags)}: {_cell(', '.join(f'`{name}`' for name in reason.flags))}) | act "
            f"| accepted with their values and ignored; the warning at start names this row | {_cell(reason.why)} "
            f"| `{DIFFERENCES_TEST}` |" for reason in IGNORED]
