"""Speculative decoding's pure parts: ngram-simple's lookup, the room a draft gets, how a verified draft
is accepted (a scripted sampler stands for the model), the flags and the timings fields."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from kinetic.cli import parse_serve_args
from kinetic.config.settings import SettingsError
from kinetic.config.speculation import conditional_probs, synthetic_rates
from kinetic.engine.llama.slots import Job, Slot
from kinetic.engine.llama.speculative import accept_drafts, draft_room, ngram_simple_draft
from kinetic.engine.options import SpecOptions, parse_spec_types
from kinetic.engine.types import GenerationRequest, Timings

# ---------------------------------------------------------------- ngram-simple


def test_ngram_simple_drafts_what_followed_the_latest_earlier_match() -> None:
    tokens = [9, 1, 2, 3, 4, 5, 8, 1, 2, 3, 6, 7, 7, 1, 2]
    # the pattern is the last n-1 tokens plus the sampled one: [1, 2, 3]; its latest earlier match is at 7
    assert ngram_simple_draft(tokens, 3, size_n=3, size_m=3) == [6, 7, 7]
    assert ngram_simple_draft(tokens, 3, size_n=3, size_m=2) == []  # a continuation shorter than n: none


def test_ngram_simple_needs_history_and_a_match() -> None:
    assert ngram_simple_draft([1, 2, 3, 1, 2], 3, size_n=2, size_m=2) == []  # n + m + 1 tokens or fewer
    assert ngram_simple_draft(list(range(20)), 99, size_n=2, size_m=2) == []  # no match
    # position 0 never counts (llama.cpp's loop stops before it)
    assert ngram_simple_draft([5, 6, 1, 2, 3, 4, 0, 0, 5], 6, size_n=2, size_m=2) == []


def test_ngram_simple_on_a_repeating_sequence_drafts_its_continuation() -> None:
    cycle = [10, 11, 12, 13, 14, 15]
    tokens = cycle * 5
    assert ngram_simple_draft(tokens, 10, size_n=3, size_m=4) == [11, 12, 13, 14]


# ---------------------------------------------------------------- accepting a draft


def _slot(tokens: list[int], drafts: list[int], *, max_tokens: int = -1) -> Slot:
    job = Job(request=GenerationRequest(prompt_tokens=[1], max_tokens=max_tokens), sampler=cast(Any, None),
              inbox=cast(Any, None), queue=cast(Any, asyncio.Queue()))
    return Slot(id=3, tokens=list(tokens) + list(drafts), job=job, drafts=list(drafts))


def _scripted(picks: list[int], *, finish_at: int | None = None):
    """The scheduler's per-token step, scripted: row r gives picks[r - first row]; `finish_at` ends it."""
    seen: list[tuple[int, int]] = []

    def sample(slot: Slot, row: int, forced: int | None = None) -> None:
        seen.append((row, len(slot.tokens)))
        token = picks[len(seen) - 1] if forced is None else forced
        slot.generated.append(token)
        if finish_at is not None and len(seen) - 1 == finish_at:
            slot.job = None
            return
        slot.next_token = token

    return sample, seen


def test_a_draft_is_accepted_up_to_the_first_difference() -> None:
    slot = _slot([1, 2, 3], [4, 5, 6])
    sample, seen = _scripted([4, 5, 9])
    trims: list[tuple[int, int]] = []
    metrics: dict[str, float] = {}
    accept_drafts(slot, 7, sample, lambda seq, n: trims.append((seq, n)) or True, metrics)
    # each row is sampled with the cells it was computed from: the last token, then each accepted draft
    assert seen == [(7, 3), (8, 4), (9, 5)]
    assert slot.tokens == [1, 2, 3, 4, 5] and slot.next_token == 9 and slot.generated == [4, 5, 9]
    assert trims == [(3, 5)]  # the cell of the rejected 6 goes
    assert (slot.n_draft, slot.n_draft_accepted) == (3, 2)
    assert metrics == {"spec_decode_num_draft_tokens_total": 3, "spec_decode_num_accepted_tokens_total": 2,
                       "spec_decode_num_drafts_total": 1}


def test_a_whole_draft_accepted_gives_one_token_more() -> None:
    slot = _slot([1, 2], [3, 4])
    sample, seen = _scripted([3, 4, 5])
    accept_drafts(slot, 0, sample, lambda seq, n: True, {})
    assert slot.tokens == [1, 2, 3, 4] and slot.next_token == 5 and len(seen) == 3
    assert slot.n_draft_accepted == 2 and slot.drafts == []


def test_a_request_that_finishes_inside_the_draft_stops_there() -> None:
    slot = _slot([1, 2], [3, 4, 5])
    sample, seen = _scripted([3, 4, 5], finish_at=1)  # e.g. EOS or a stop word on the second row
    trims: list[tuple[int, int]] = []
    accept_drafts(slot, 0, sample, lambda seq, n: trims.append((seq, n)) or True, {})
    assert len(seen) == 2 and slot.tokens == [1, 2, 3]  # its release removes the cells past these
    assert trims == [] and slot.n_draft_accepted == 1


def test_cells_that_cannot_be_removed_fail_the_step() -> None:
    slot = _slot([1], [2])
    sample, _ = _scripted([7])
    with pytest.raises(RuntimeError, match="rejected draft"):
        accept_drafts(slot, 0, sample, lambda seq, n: False, {})


def test_synthetic_acceptance_takes_the_draft_whatever_the_model_picks() -> None:
    """--spec-synth-rates 1,1,1: every draft token stands although the model picks others (llama.cpp's
    test_synth_ignores_target_tokens), and the row after the draft gives one more token, the model's."""
    slot = _slot([1, 2], [3, 4, 5])
    sample, seen = _scripted([7, 7, 7, 9])
    accept_drafts(slot, 0, sample, lambda seq, n: True, {}, synthetic=lambda i: True)
    assert slot.tokens == [1, 2, 3, 4, 5] and slot.generated == [3, 4, 5, 9] and slot.next_token == 9
    assert (slot.n_draft, slot.n_draft_accepted, len(seen)) == (3, 3, 4)


def test_a_synthetic_refusal_ends_the_draft_even_where_the_pick_matches() -> None:
    slot = _slot([1, 2], [3, 4, 5])
    sample, _ = _scripted([3, 4, 5, 6])  # the model would take the whole draft
    trims: list[tuple[int, int]] = []
    accept_drafts(slot, 0, sample, lambda seq, n: trims.append((seq, n)) or True, {}, synthetic=lambda i: i < 1)
    assert slot.n_draft_accepted == 1 and slot.generated == [3, 4] and trims == [(3, 3)]


def test_a_synthetic_draft_never_takes_an_end_of_generation_token() -> None:
    slot = _slot([1, 2], [3, 0, 5])  # 0 ends a generation
    sample, _ = _scripted([8, 8, 8])
    accept_drafts(slot, 0, sample, lambda seq, n: True, {}, synthetic=lambda i: True, is_eog=lambda t: t == 0)
    assert slot.n_draft_accepted == 1 and slot.generated == [3, 8]


def test_synthetic_rates_resolve_as_llama_cpp_resolves_them() -> None:
    assert synthetic_rates((1.0, 0.5, 0.25), None, 3) == (1.0, 0.5, 0.25)
    assert conditional_probs((1.0, 0.5, 0.25)) == (1.0, 0.5, 0.5)
    assert conditional_probs((0.5, 0.0, 0.0)) == (0.5, 0.0, 0.0)
    assert synthetic_rates(None, 4.0, 3) == (1.0, 1.0, 1.0)  # L = n_max + 1: every token
    assert synthetic_rates(None, 1.0, 2) == (0.0, 0.0)
    p = synthetic_rates(None, 2.0, 4)[0]
    assert sum(p ** (i + 1) for i in range(4)) == pytest.approx(1.0, abs=1e-6)  # mean length 2: one draft token
    assert synthetic_rates(None, None, 3) == ()


def test_bad_synthetic_acceptance_flags_are_refused_at_start(tmp_path) -> None:
    draft = tmp_path / "draft.gguf"
    draft.write_bytes(b"GGUF")
    md = ("-md", str(draft))  # draft-simple: --spec-draft-n-max's 3 tokens
    settings = parse_serve_args(["--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "3",
                                 "--spec-synth-rates", "1,0.5,0.5"], {})
    assert settings.spec_options().synth_probs == (1.0, 0.5, 1.0)
    # the longest draft of the kinds asked (llama.cpp's common_speculative_n_max): ngram-simple's 48 here
    simple = parse_serve_args(["--spec-type", "ngram-simple,draft-simple", "--spec-synth-len", "2"], {})
    assert len(simple.spec_options().synth_probs) == 48
    assert parse_serve_args(["--spec-synth-rates", "1,0.5"], {}).spec_options().synth_probs == ()  # no drafts
    for args, message in (([*md, "--spec-synth-rates", "1,0.5"], "must contain 3 values"),
                          ([*md, "--spec-synth-rates", "0.5,0.6,0.1"], "non-increasing"),
                          (["--spec-synth-rates", "1,x,0"], "--spec-synth-rates: not a comma-separated list"),
                          ([*md, "--spec-synth-rates", "1,1,1.5"], r"within \[0, 1\]"),
                          ([*md, "--spec-synth-len", "5"], r"--spec-synth-len must be finite and within \[1, 4\]"),
                          ([*md, "--spec-synth-len", "2", "--spec-synth-rates", "1,1,1"], "mutually exclusive")):
        with pytest.raises(SettingsError, match=message):
            parse_serve_args(args, {})


def test_a_draft_stays_inside_the_context_and_max_tokens() -> None:
    slot = _slot(list(range(100)), [], max_tokens=10)
    slot.generated = [0] * 6  # six out, counting the sampled token not yet decoded
    assert draft_room(slot, slot_n_ctx=4096) == 3  # its rows give at most 1 + 3 tokens: 10 in all
    assert draft_room(slot, slot_n_ctx=103) == 1  # one cell spare, as llama-server's get_n_draft_max
    slot.job = Job(request=GenerationRequest(prompt_tokens=[1]), sampler=cast(Any, None), inbox=cast(Any, None),
                   queue=cast(Any, None))
    assert draft_room(slot, slot_n_ctx=4096) == 4096 - 100 - 2


# ---------------------------------------------------------------- flags and fields


def test_spec_types_read_as_llama_cpp_reads_them() -> None:
    assert parse_spec_types("ngram-simple,draft-simple") == ("ngram-simple", "draft-simple")
    assert parse_spec_types("ngram-simple,none") == ()
    with pytest.raises(ValueError, match="unknown speculative type 'ngram'"):
        parse_spec_types("ngram")
    options = SpecOptions(types=("draft-simple", "ngram-mod", "ngram-simple", "draft-mtp"))
    assert options.runnable == ("ngram-simple", "ngram-mod")  # llama.cpp's order; draft-simple needs a draft model
    assert options.not_run == ("draft-mtp",)


def test_speculation_flags_fill_spec_options(tmp_path) -> None:
    draft = tmp_path / "draft.gguf"
    draft.write_bytes(b"GGUF")
    settings = parse_serve_args(["-md", str(draft), "--draft-max", "8", "--spec-draft-n-min", "2",
                                 "--draft-p-min", "0.5"], {})
    spec = settings.spec_options()
    assert spec.types == ("draft-simple",)  # -md alone: llama-server's older meaning
    assert (spec.draft_model, spec.n_max, spec.n_min, spec.p_min) == (str(draft), 8, 2, 0.5)
    ngram = parse_serve_args(["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "4",
                              "--spec-ngram-simple-size-m", "16"], {}).spec_options()
    assert (ngram.types, ngram.runnable, ngram.ngram_size_n, ngram.ngram_size_m) == (
        ("ngram-simple",), ("ngram-simple",), 4, 16)
    assert parse_serve_args([], {}).spec_options().enabled is False
    assert parse_serve_args([], {"LLAMA_ARG_SPEC_TYPE": "ngram-simple"}).spec_options().enabled


def test_bad_speculation_flags_are_named() -> None:
    with pytest.raises(SettingsError, match="--spec-type"):
        parse_serve_args(["--spec-type", "ngram"], {})
    with pytest.raises(SettingsError, match="-md|--spec-draft-model"):
        parse_serve_args(["-md", "/nonexistent/draft.gguf"], {})


def test_timings_show_the_draft_counts_only_when_something_was_drafted() -> None:
    plain = Timings(cache_n=0, prompt_n=3, prompt_ms=1.0, predicted_n=5, predicted_ms=2.0).to_dict()
    assert "draft_n" not in plain and "draft_n_accepted" not in plain
    drafted = Timings(cache_n=0, prompt_n=3, prompt_ms=1.0, predicted_n=5, predicted_ms=2.0, draft_n=4,
                      draft_n_accepted=3).to_dict()
    assert (drafted["draft_n"], drafted["draft_n_accepted"]) == (4, 3)
