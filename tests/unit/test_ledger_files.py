"""The ledger file itself, on the real file system: a torn last line set aside at start, paths that
are no regular file refused at start (one line, before any model loads), a write that fails marks
the ledger unwritable, and reading back stays bounded however long a line is."""

from __future__ import annotations

import errno
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kinetic.classroom.budgets import Budgets
from kinetic.classroom.ledger import (
    TORN_SUFFIX,
    LedgerRecord,
    LedgerWriter,
    ledger_lines,
    ledger_path_problem,
    read_ledger,
    set_aside_torn_tail,
)
from kinetic.cli import main


def line(client: str, tokens: int) -> str:
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return LedgerRecord(time=now, client=client, route="/v1/chat/completions", status=200,
                        prompt_tokens=tokens, completion_tokens=1).to_line()


def test_a_torn_last_line_is_set_aside_and_every_line_left_parses(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    ledger = tmp_path / "ledger.jsonl"
    whole = line("ann", 3) + line("ben", 4)
    torn = line("cam", 5)[:25]  # the server died in the middle of this append
    ledger.write_text(whole + torn, encoding="utf-8")
    assert set_aside_torn_tail(ledger) == len(torn)
    assert ledger.read_text(encoding="utf-8") == whole
    assert (tmp_path / f"ledger.jsonl{TORN_SUFFIX}").read_text(encoding="utf-8") == torn
    assert [r.client for r in read_ledger(ledger)] == ["ann", "ben"]
    assert all(LedgerRecord.from_line(text) is not None for text in ledger.read_text().splitlines())
    assert any("torn" in message for message in caplog.messages)
    assert set_aside_torn_tail(ledger) == 0  # now whole: nothing more is moved
    writer = LedgerWriter(ledger)  # the next record starts a line of its own
    writer.write(LedgerRecord.model_validate_json(line("dan", 6)))
    writer.close()
    assert [r.client for r in read_ledger(ledger)] == ["ann", "ben", "dan"]


def test_a_ledger_that_is_one_torn_line_is_emptied(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_bytes(b'{"time":"2026-' * 10000)  # longer than one backwards block, no newline at all
    assert set_aside_torn_tail(ledger) == 140000
    assert ledger.stat().st_size == 0
    assert (tmp_path / f"ledger.jsonl{TORN_SUFFIX}").stat().st_size == 140000
    assert set_aside_torn_tail(tmp_path / "missing.jsonl") == 0


def test_only_a_regular_file_or_a_new_path_can_be_the_ledger(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (tmp_path / "ok.jsonl").write_text("", encoding="utf-8")
    assert ledger_path_problem(tmp_path / "ok.jsonl") is None
    assert ledger_path_problem(tmp_path / "new.jsonl") is None
    assert "a directory" in (ledger_path_problem(tmp_path) or "")
    assert "a FIFO" in (ledger_path_problem(fifo) or "")
    if Path("/dev/full").exists():
        assert "a character device" in (ledger_path_problem("/dev/full") or "")


@pytest.mark.parametrize("kind", ["device", "directory"])
def test_serve_refuses_a_ledger_that_is_no_file_in_one_line(kind: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = "/dev/full" if kind == "device" else str(tmp_path)
    if kind == "device" and not Path(path).exists():
        pytest.skip("no /dev/full on this machine")
    # before the model loads: the model path does not even exist, and the ledger is what is refused
    assert main(["serve", "-m", str(tmp_path / "absent.gguf"), "--ledger", path]) == 1
    err = [text for text in capsys.readouterr().err.splitlines() if text.strip()]
    assert len(err) == 1
    assert err[0].startswith(f"error: cannot use {path} as the ledger: it is a ")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full on this machine")
def test_a_write_that_fails_marks_the_ledger_unwritable(tmp_path: Path) -> None:
    writer = LedgerWriter("/dev/full")  # every write() there fails with ENOSPC: a full disk, for real
    assert writer.problem is None  # nothing has failed yet
    with pytest.raises(OSError) as failed:
        writer.write(LedgerRecord.model_validate_json(line("ann", 3)))
    assert failed.value.errno == errno.ENOSPC
    assert writer.problem is not None and "/dev/full" in writer.problem and "class record" in writer.problem
    assert not writer.writable()  # the probe write fails too
    writer.close()


def test_reading_back_skips_an_overlong_line_and_a_torn_end(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text(line("ann", 3) + "x" * 500 + "\n" + line("ben", 4) + '{"time":', encoding="utf-8")
    kept = list(ledger_lines(ledger, max_line=300))
    assert [LedgerRecord.from_line(text).client for text in kept] == ["ann", "ben"]  # type: ignore[union-attr]
    budgets = Budgets()
    assert budgets.load_ledger(ledger) == 2  # the over-long line and the torn end are not records
