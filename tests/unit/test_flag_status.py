"""Every llama-server flag acts or is ignored for a reason with its row (kinetic/config/flag_status.py); the
reference pages say so, and a flag documented as acting is wired to something kinetic reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kinetic.cli import main
from kinetic.config.args import parse_serve_args
from kinetic.config.flag_status import (
    CLI_ACTIONS,
    IGNORED,
    TABLE_END,
    TABLE_START,
    acting_flags,
    difference_rows,
    ignored_by_flag,
    reference_table,
    variable_warning,
    warning,
)
from kinetic.config.flags import FLAGS, FLAGS_BY_SPELLING
from kinetic.config.llama_flags import llama_server_flags
from kinetic.config.sampling_defaults import FROM_SETTING

ROOT = Path(__file__).resolve().parents[2]
CLI_PAGE = ROOT / "docs" / "reference" / "cli.md"
DIFFERENCES_PAGE = ROOT / "docs" / "reference" / "http-llamacpp.md"
ACTING_BEFORE_ISSUE_23 = 43  # llama-server flags kinetic's settings took before (FACTS.md, 2026-12-01)


def test_every_llama_server_flag_acts_or_has_one_reason() -> None:
    acting = {flag.names[0] for flag in acting_flags()}
    reasons = [name for reason in IGNORED for name in reason.flags]
    assert len(reasons) == len(set(reasons)), "a flag under two reasons"
    assert not acting & set(reasons), "a flag both acting and ignored"
    assert acting | set(reasons) == {flag.names[0] for flag in llama_server_flags()}


def test_the_reference_pages_are_current() -> None:
    """Regenerate with scripts/gen_cli_reference.py."""
    page = CLI_PAGE.read_text(encoding="utf-8")
    assert page[page.index(TABLE_START):page.index(TABLE_END) + len(TABLE_END)] == reference_table()
    differences = DIFFERENCES_PAGE.read_text(encoding="utf-8").splitlines()
    for row in difference_rows():
        assert row in differences


def documented_acting_rows() -> list[list[str]]:
    page = CLI_PAGE.read_text(encoding="utf-8")
    table = page[page.index(TABLE_START):page.index(TABLE_END)]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| `")]
    return [re.findall(r"`([^`]+)`", row[0]) for row in rows if row[1] == "acts"]


def test_acting_flags_counted_from_the_page_are_wired() -> None:
    """Each flag the page says acts is a setting (or -h, --version), and the setting is read somewhere
    besides its declaration: a flag documented as acting cannot be only parsed."""
    rows = documented_acting_rows()
    assert len(rows) == len(acting_flags())
    sources = "\n".join(path.read_text(encoding="utf-8") for path in (ROOT / "kinetic").rglob("*.py"))
    for spellings in rows:
        if spellings[0] in CLI_ACTIONS:
            continue
        flag = next((FLAGS_BY_SPELLING[s] for s in spellings if s in FLAGS_BY_SPELLING), None)
        assert flag is not None, f"{spellings[0]} is documented as acting but is no setting"
        if flag.dest in FROM_SETTING.values():
            continue  # a sampler's setting is read by name (test_sampling_defaults: each reaches the defaults)
        assert re.search(rf"(settings|self)\.{flag.dest}\b", sources), \
            f"{spellings[0]}: settings.{flag.dest} is never read"
    # the count the issue's closing note gives: 43 before, now more than twice that
    assert len(rows) - len(CLI_ACTIONS) > 2 * ACTING_BEFORE_ISSUE_23


def test_ignored_flags_warn_naming_their_row() -> None:
    differences = DIFFERENCES_PAGE.read_text(encoding="utf-8")
    for reason in IGNORED:
        assert f"| {reason.row} (" in differences
        for name in reason.flags:
            assert f'"{reason.row}"' in warning(name), name
    assert "ignored flags: checkpoint spacing" in warning("--checkpoint-min-step")  # any spelling
    assert '"ignored flags: remote devices and fitting to memory"' in variable_warning("LLAMA_ARG_RPC")
    assert variable_warning("KINETIC_PROT") == "warning: KINETIC_PROT is not a kinetic setting; ignored"
    assert ignored_by_flag()["--rpc"].row == "ignored flags: remote devices and fitting to memory"


def test_the_warning_at_start_names_the_row(capsys: pytest.CaptureFixture[str]) -> None:
    """serve() prints one warning per ignored flag before it loads anything; a missing model stops it there."""
    from kinetic.cli import serve

    settings = parse_serve_args(["-m", "/no/such/model.gguf", "--rpc", "h:1", "-cms", "64"], environ={})
    assert serve(settings) == 1
    err = capsys.readouterr().err
    assert '--rpc is ignored: see "ignored flags: remote devices and fitting to memory"' in err
    assert '-cms is ignored: see "ignored flags: checkpoint spacing"' in err


def test_help_shows_which_flags_act(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in FLAGS:
        assert flag.names[0] in out
    assert f"{len(acting_flags())} of llama-server's {len(llama_server_flags())} flags" in out
    for reason in IGNORED:
        assert reason.row.removeprefix("ignored flags: ") + ":" in out
        epilog = out[out.index(reason.row.removeprefix("ignored flags: ") + ":"):]
        assert reason.flags[0] in epilog
