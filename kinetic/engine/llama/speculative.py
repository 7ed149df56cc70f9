"""Speculative decoding: drafts proposed for a generating slot, verified in the scheduler's one decode.

Each step, a slot about to decode its last sampled token may first get a draft: tokens guessed to come
next, from its own history (`ngram-simple`: the n-gram it just produced appeared before; the tokens that
followed it then are the guess) or from a small draft model run on the slot's tokens (`draft-simple`).
The scheduler puts [last token + draft] into its batch with logits on every row, and the slot's own
sampler then picks from row after row (`accept_drafts`): while its pick equals the draft, the draft's
KV cell is already right and the next row is valid too; at the first difference the pick is kept, the
cells of the rest of the draft are removed (llama_memory_seq_rm), and the slot goes on from there. So the
output is what the slot would have produced one token a step (greedy or not: each pick is the sampler's,
from the same logits), only several tokens come out of one decode when the guess was good.

The order of preference and the limits are llama-server's (common/speculative.cpp): ngram-simple first,
the draft model for slots it found nothing for; a draft never runs past the slot's context or its
max_tokens; draft-simple keeps its greedy guesses while their probability (over the draft model's top
10) stays at --spec-draft-p-min or above, at most --spec-draft-n-max of them, and drops a draft shorter
than --spec-draft-n-min. The draft model is a second llama context with one sequence per slot, decoded
by the same thread just before the main decode (never at the same time: both would spin the cores).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import llama_cpp
import numpy as np
from llama_cpp import _internals

from kinetic.engine.llama.batch import add_token
from kinetic.engine.llama.model import LoadedModel
from kinetic.engine.llama.ngram_drafts import Drafter, make_drafters
from kinetic.engine.llama.params import context_params
from kinetic.engine.llama.sampler import logits_row
from kinetic.engine.options import SpecOptions
from kinetic.engine.text import common_prefix
from kinetic.errors import ModelLoadError

if TYPE_CHECKING:
    from kinetic.engine.llama.slots import Slot

log = logging.getLogger(__name__)

DRAFT_TOP_K = 10  # llama-server's draft sampler: top-k 10, the top token's probability among them
VOCAB_MAX_SIZE_DIFFERENCE = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
VOCAB_CHECK_START = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID: the first tokens (BOS, EOS...) may differ


def ngram_simple_draft(tokens: list[int], sampled: int, size_n: int, size_m: int) -> list[int]:
    """llama.cpp's ngram-simple: the last `size_n` tokens (ending with `sampled`, not yet in `tokens`),
    looked up backwards in `tokens`; the up to `size_m` tokens that followed the latest earlier match are
    the draft. No match, too short a history or a continuation shorter than `size_n`: no draft."""
    n = len(tokens)
    if n <= size_n + size_m + 1:
        return []
    pattern = tokens[n - size_n + 1:] + [sampled]
    first = pattern[0]
    for start in range(n - size_n - 1, 0, -1):  # position 0 never counts as a match (llama.cpp's)
        if tokens[start] == first and tokens[start:start + size_n] == pattern:
            count = min(size_m, n - (start + size_n))
            return tokens[start + size_n:start + size_n + count] if count >= size_n else []
    return []


@dataclass
class DraftWanted:
    """A slot that may get a draft this step: what its KV holds, the token it decodes next, the room."""

    seq: int
    history: list[int]
    last: int
    n_max: int


class DraftModel:
    """The draft model's context: one sequence per slot, kept in step with what the slot holds."""

    def __init__(self, path: Path, target: LoadedModel, *, n_ctx: int, n_slots: int, n_batch: int, n_ubatch: int,
                 n_threads: int, kv_unified: bool):
        # the target's adapters and metadata overrides are the target's own
        options = replace(target.options, lora=(), kv_overrides=())
        self.model = LoadedModel(path, verbose=target.verbose, options=options)
        check_vocab(target, self.model)
        params = context_params(options, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_seq_max=n_slots,
                                n_threads=n_threads, kv_unified=kv_unified)
        self.ctx = self.model.new_context(params)
        self.n_batch = params.n_batch
        self.n_vocab_target = target.n_vocab
        self.batch = _internals.LlamaBatch(n_tokens=self.n_batch, embd=0, n_seq_max=1, verbose=target.verbose)
        self.held: list[list[int]] = [[] for _ in range(n_slots)]  # what each sequence's cells hold

    def draft(self, wanted: list[DraftWanted], options: SpecOptions) -> dict[int, list[int]]:
        """Greedy drafts for the slots in `wanted`: first their new tokens (and `last`) are decoded, then one
        drafted token of every slot still drafting per decode."""
        picks = self._catch_up(wanted, options.p_min)
        drafts: dict[int, list[int]] = {w.seq: [] for w in wanted}
        limits = {w.seq: min(options.n_max, w.n_max) for w in wanted}
        while picks:
            self.batch.batch.n_tokens = 0
            rows: list[int] = []
            for seq, (token, p) in picks.items():
                if p < options.p_min or token >= self.n_vocab_target:
                    continue
                drafts[seq].append(token)
                if len(drafts[seq]) >= limits[seq]:
                    continue
                rows.append(seq)
                self._add(token, len(self.held[seq]), seq, True)
                self.held[seq].append(token)
            if not rows:
                break
            self._decode()
            picks = {seq: self._pick(row, options.p_min) for row, seq in enumerate(rows)}
        return {seq: draft for seq, draft in drafts.items() if draft and len(draft) >= options.n_min}

    def _catch_up(self, wanted: list[DraftWanted], p_min: float) -> dict[int, tuple[int, float]]:
        """Brings each sequence to its slot's history plus `last`, in batches of n_batch; the pick after
        `last` of each."""
        memory = self.ctx.memory
        queue: list[tuple[int, int, int, bool]] = []  # token, position, sequence, logits
        for w in wanted:
            held = self.held[w.seq]
            n = common_prefix(held, w.history)
            if n < len(held) and not llama_cpp.llama_memory_seq_rm(memory, w.seq, n, -1):
                llama_cpp.llama_memory_seq_rm(memory, w.seq, -1, -1)  # a recurrent draft: start it over
                n = 0
            del held[n:]
            pending = w.history[n:] + [w.last]
            queue += [(t, n + i, w.seq, i == len(pending) - 1) for i, t in enumerate(pending)]
            held += pending
        picks: dict[int, tuple[int, float]] = {}
        for start in range(0, len(queue), self.n_batch):
            chunk = queue[start:start + self.n_batch]
            self.batch.batch.n_tokens = 0
            for item in chunk:
                self._add(*item)
            self._decode()
            picks.update({seq: self._pick(row, p_min) for row, (_, _, seq, logits) in enumerate(chunk) if logits})
        return picks

    def _pick(self, row: int, p_min: float) -> tuple[int, float]:
        """The draft's top token at batch row `row`, and its probability among the top 10 (only worked out
        when --spec-draft-p-min asks: the vocabulary is large)."""
        logits = logits_row(self.ctx, row, self.model.n_vocab)
        token = int(logits.argmax())
        if p_min <= 0.0:
            return token, 1.0
        top = logits[np.argpartition(-logits, DRAFT_TOP_K)[:DRAFT_TOP_K]].astype(np.float64)
        return token, float(1.0 / np.exp(top - top.max()).sum())

    def _add(self, token: int, pos: int, seq: int, logits: bool) -> None:
        add_token(self.batch, token, pos, seq, logits)

    def _decode(self) -> None:
        status = llama_cpp.llama_decode(self.ctx.ctx, self.batch.batch)
        if status != 0:
            # the draft context is as large as the target's, so this is not a full cache: start over
            for seq, held in enumerate(self.held):
                llama_cpp.llama_memory_seq_rm(self.ctx.memory, seq, -1, -1)
                held.clear()
            raise RuntimeError(f"the draft model's llama_decode failed with status {status}")


def check_vocab(target: LoadedModel, draft: LoadedModel) -> None:
    """llama.cpp's common_speculative_are_compatible: the same kind of vocabulary, BOS and EOS, about the
    same size, and the same text for every token both have."""
    t, d = target.model, draft.model
    if t.vocab_type() != d.vocab_type() or t.token_bos() != d.token_bos() or t.token_eos() != d.token_eos() \
            or t.add_bos_token() != d.add_bos_token():
        raise ModelLoadError(f"the draft model {draft.path} has another vocabulary than {target.path} "
                             "(type, BOS or EOS differ)")
    if abs(target.n_vocab - draft.n_vocab) > VOCAB_MAX_SIZE_DIFFERENCE:
        raise ModelLoadError(f"the draft model {draft.path} has {draft.n_vocab} tokens, {target.path} "
                             f"{target.n_vocab}: at most {VOCAB_MAX_SIZE_DIFFERENCE} may differ")
    for token in range(VOCAB_CHECK_START, min(target.n_vocab, draft.n_vocab)):
        if target.token_piece(token, special=True) != draft.token_piece(token, special=True):
            raise ModelLoadError(f"the draft model {draft.path} has another token {token} than {target.path}")


class Speculator:
    """The server's speculative decoding: which slots get drafts, from which kind, and their accounting."""

    def __init__(self, options: SpecOptions, draft_model: DraftModel | None):
        self.options = options
        self.draft_model = draft_model
        self.types = tuple(t for t in options.runnable if t != "draft-simple" or draft_model is not None)
        self.drafters = make_drafters(options)  # the other n-gram kinds (ngram_drafts.py)
        self._tasks: dict[int, int] = {}  # the job each sequence's drafter state belongs to
        self._drafted_by: dict[int, Drafter] = {}  # which drafter made a sequence's draft in this step
        self._synth_rng: dict[int, random.Random] = {}  # --spec-synth-*: each sequence's draws, seeded by its job
        if options.synth_probs:
            log.warning("synthetic speculative acceptance is enabled for benchmarking; generated output is not "
                        "valid (chances by draft position: %s)", ", ".join(f"{p:.6g}" for p in options.synth_probs))

    def begin(self, slot: Slot) -> None:
        """A drafter's state follows its slot's job: a new job starts it again from the job's prompt."""
        if self._tasks.get(slot.id) != slot.id_task:
            self._tasks[slot.id] = slot.id_task
            for drafter in self.drafters.values():
                drafter.begin(slot.id, slot.prompt)
            if self.options.synth_probs:  # as llama-server: the request's seed, else a fresh one
                assert slot.job is not None
                seed = slot.job.request.sampling.seed
                self._synth_rng[slot.id] = random.Random(seed if seed >= 0 else None)

    def verify(self, slot: Slot, first_row: int, sample: Callable[[Slot, int, int | None], None],
               trim: Callable[[int, int], bool], metrics: dict[str, float], is_eog: Callable[[int], bool]) -> None:
        """The slot's draft checked against its rows (`accept_drafts`), and what held told to its drafter."""
        self.accepted(slot.id, accept_drafts(slot, first_row, sample, trim, metrics, self.synthetic(slot), is_eog))

    def synthetic(self, slot: Slot) -> Callable[[int], bool] | None:
        """--spec-synth-*: whether draft position i of `slot`'s draft is taken, drawn at random (position i is
        asked only once 0..i-1 were taken); None when drafts are verified against the model."""
        rng = self._synth_rng.get(slot.id)
        if rng is None:
            return None
        probs = self.options.synth_probs
        return lambda i: i < len(probs) and rng.random() < probs[i]

    def accepted(self, seq: int, n_accepted: int) -> None:
        """How much of a sequence's draft held, told to the drafter that made it (map-k and mod learn from it)."""
        drafter = self._drafted_by.pop(seq, None)
        if drafter is not None:
            drafter.accepted(seq, n_accepted)

    def drafts_for(self, generating: list[Slot], *, slot_n_ctx: int, n_batch: int) -> dict[int, list[int]]:
        """This step's drafts of the slots about to decode their last token, each within the room its context
        and max_tokens leave, and all within the batch beside those last tokens."""
        wanted: list[DraftWanted] = []
        budget = n_batch - len(generating)
        for slot in generating:
            room = min(draft_room(slot, slot_n_ctx), budget)
            if room > 0 and slot.next_token is not None:
                self.begin(slot)
                wanted.append(DraftWanted(seq=slot.id, history=slot.tokens, last=slot.next_token, n_max=room))
                budget -= room
        return self.propose(wanted) if wanted else {}

    def propose(self, wanted: list[DraftWanted]) -> dict[int, list[int]]:
        """Drafts by slot (sequence id): ngram-simple's where it finds one, the draft model's for the rest."""
        drafts: dict[int, list[int]] = {}
        self._drafted_by.clear()
        if "ngram-simple" in self.types:
            for w in wanted:
                found = ngram_simple_draft(w.history, w.last, self.options.ngram_size_n, self.options.ngram_size_m)
                if found:
                    drafts[w.seq] = found[:w.n_max]
        for drafter in self.drafters.values():
            for w in wanted:
                if w.seq not in drafts and (found := drafter.draft(w.seq, w.history, w.last)[:w.n_max]):
                    drafts[w.seq] = found
                    self._drafted_by[w.seq] = drafter
        rest = [w for w in wanted if w.seq not in drafts]
        if self.draft_model is not None and rest:
            try:
                drafts.update(self.draft_model.draft(rest, self.options))
            except RuntimeError:  # the step goes on without these drafts
                log.exception("drafting failed")
        return drafts


def make_speculator(options: SpecOptions, target: LoadedModel, *, n_ctx: int, n_slots: int, n_batch: int,
                    n_ubatch: int, n_threads: int, kv_unified: bool, exact_states: bool) -> Speculator | None:
    """The server's Speculator, or None when nothing asked for one or the model cannot take it back."""
    if not options.types:
        return None
    for kind in options.not_run:  # eagle3, mtp, dflash, dspark: a draft model's heads kinetic cannot load
        log.warning("speculative type %s is not implemented in kinetic; ignored", kind)
    if "draft-simple" in options.types and not options.draft_model:
        log.warning("speculative type draft-simple needs a draft model (-md); ignored")
    if not options.enabled:
        return None
    if exact_states:
        # llama-server rolls a hybrid or recurrent model back with a state checkpoint taken before each
        # verification; kinetic's decode loop does not, so it does not speculate on them.
        log.warning("speculative decoding is off: %s keeps a recurrent state that a rejected draft cannot be "
                    "removed from", target.path.name)
        return None
    draft_model = None
    if "draft-simple" in options.runnable and options.draft_model:
        draft_model = DraftModel(Path(options.draft_model), target, n_ctx=n_ctx, n_slots=n_slots, n_batch=n_batch,
                                 n_ubatch=n_ubatch, n_threads=n_threads, kv_unified=kv_unified)
    speculator = Speculator(options, draft_model)
    log.info("speculative decoding: %s", ", ".join(speculator.types))
    return speculator


def draft_room(slot: Slot, slot_n_ctx: int) -> int:
    """llama-server's get_n_draft_max: a draft stays inside the slot's context (one cell spare) and leaves
    room for the token its last row gives, within max_tokens."""
    assert slot.job is not None
    room = slot_n_ctx - len(slot.tokens) - 2
    max_tokens = slot.job.request.max_tokens
    if max_tokens > 0:
        room = min(room, max_tokens - len(slot.generated) - 1)
    return room


def accept_drafts(slot: Slot, first_row: int, sample: Callable[[Slot, int, int | None], None],
                  trim: Callable[[int, int], bool], metrics: dict[str, float],
                  synthetic: Callable[[int], bool] | None = None,
                  is_eog: Callable[[int], bool] = lambda token: False) -> int:
    """Samples the slot's rows one after the other (row `first_row` follows its last token, each next one
    a draft token) while the pick equals the draft; keeps the cells of the drafts accepted and removes the
    rest. `sample` is the scheduler's per-token step: it emits the token (the one given, else its pick), or
    finishes the request; `trim` removes a sequence's cells from a position on (llama_memory_seq_rm).
    `synthetic` (--spec-synth-*, benchmarking) takes or refuses each draft token at random instead, never an
    end-of-generation one (`is_eog`), as llama-server's server_sample_and_accept_synth. Returns how many of the
    drafts held."""
    drafts, slot.drafts = slot.drafts, []
    base = len(slot.tokens) - len(drafts)  # what the KV holds up to the last sampled token
    accepted = 0
    # counted before the rows are sampled: the row that finishes the request sends its timings
    slot.n_draft += len(drafts)
    for i in range(len(drafts) + 1):
        del slot.tokens[base + i:]  # the cells row first_row + i was computed from
        taken = synthetic is not None and i < len(drafts) and synthetic(i) and not is_eog(drafts[i])
        sample(slot, first_row + i, drafts[i] if taken else None)
        if slot.job is None:  # finished: its release removed the cells past slot.tokens
            break
        refused = synthetic is not None and not taken  # a synthetic refusal ends the draft, whatever the pick
        if i == len(drafts) or refused or slot.next_token != drafts[i]:
            if not trim(slot.id, len(slot.tokens)):
                raise RuntimeError(f"llama.cpp could not remove the rejected draft of slot {slot.id}")
            break
        slot.tokens.append(drafts[i])  # in the KV already
        slot.next_token = None
        accepted += 1
        slot.n_draft_accepted += 1
    metrics["spec_decode_num_draft_tokens_total"] = metrics.get("spec_decode_num_draft_tokens_total", 0) + len(drafts)
    metrics["spec_decode_num_accepted_tokens_total"] = (metrics.get("spec_decode_num_accepted_tokens_total", 0)
                                                        + accepted)
    metrics["spec_decode_num_drafts_total"] = metrics.get("spec_decode_num_drafts_total", 0) + 1
    return accepted
