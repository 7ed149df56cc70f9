"""llama-server's reasoning budget (--reasoning-budget, `thinking_budget_tokens`): thinking ends after N tokens.

The state machine of llama.cpp's common/reasoning-budget.cpp: idle until the start tag (or counting from the
first token when the prompt already opened the block), counting the thinking tokens, then, once the budget is
spent and the last token completed its UTF-8 character, forcing the budget message and the end tag one token
at a time; done after that, and counting again should the model open another block. A natural end tag ends the
count. The tags are matched in the generated text rather than as token sequences, so a tag the model spells
with other tokens than the tokenizer's still counts.

Reasoning control (`reasoning_control: true`, a budget with no limit) ends the thinking on request: end_now()
moves a counting tracker to forcing, as a spent budget would.

BudgetedSampler is the Sampler of a request with a budget: it hands out the forced tokens in place of a sample,
and tells the state machine every token it accepts.
"""

from __future__ import annotations

import codecs
from enum import Enum

from llama_cpp import _internals

from kinetic.engine.llama.model import LoadedModel
from kinetic.engine.llama.sampler import Sampler
from kinetic.engine.types import ReasoningBudget, SamplingParams, TokenLogprob, TokenProb

TAIL_CHARS = 64  # generated text kept to find a tag that spans tokens


class BudgetState(Enum):
    IDLE = "idle"  # waiting for the start tag
    COUNTING = "counting"
    WAITING_UTF8 = "waiting_utf8"  # budget spent, finishing a character
    FORCING = "forcing"  # writing the message and the end tag
    DONE = "done"


class BudgetTracker:
    """Where one generation stands against its reasoning budget."""

    def __init__(self, budget: ReasoningBudget, model: LoadedModel):
        self.budget = budget
        self.model = model
        self.forced = (model.tokenize(budget.message, add_special=False, parse_special=True) if budget.message
                       else []) + model.tokenize(budget.end, add_special=False, parse_special=True)
        self.state = BudgetState.IDLE
        self.remaining = budget.tokens
        self.position = 0  # next forced token
        self.thinking_tokens = 0  # generated inside the block before the end was forced or written
        self._tail = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        # set from the event loop (reasoning control), acted on by the decode thread at its next token, so the
        # state machine only ever moves on one thread
        self._end_wanted = False
        if budget.starts_inside:
            self._start_counting()

    def _start_counting(self) -> None:
        self.state, self.remaining, self._tail = BudgetState.COUNTING, self.budget.tokens, ""
        if self.remaining <= 0:
            self._force()

    def _force(self) -> None:
        self.state, self.position = BudgetState.FORCING, 0

    def end_now(self) -> None:
        """Reasoning control's `reasoning_end`: the thinking under way ends at the next token (llama.cpp's
        common_reasoning_budget_force: only while counting; before the block or after its end, nothing)."""
        self._end_wanted = True

    def forced_token(self) -> int | None:
        """The token the next step must produce, or None to sample."""
        if self._end_wanted:
            self._end_wanted = False
            if self.state is BudgetState.COUNTING:
                self._force()
        if self.state is BudgetState.FORCING and self.position < len(self.forced):
            return self.forced[self.position]
        return None

    def accept(self, token: int) -> None:
        text = self._decoder.decode(self.model.token_piece(token, special=True))
        whole_character = not self._decoder.getstate()[0]
        self._tail = (self._tail + text)[-TAIL_CHARS:]
        state = self.state
        if state in (BudgetState.IDLE, BudgetState.DONE):
            if self.budget.start in self._tail:
                self._start_counting()
        elif state is BudgetState.FORCING:
            self.position += 1
            if self.position >= len(self.forced):
                self.state, self._tail = BudgetState.DONE, ""
        elif self.budget.end in self._tail:  # counting or waiting: the model ended its thoughts itself
            self.state, self._tail = BudgetState.DONE, ""
        elif state is BudgetState.COUNTING:
            self.thinking_tokens += 1
            self.remaining -= 1
            if self.remaining <= 0:
                if whole_character:
                    self._force()
                else:
                    self.state = BudgetState.WAITING_UTF8
        else:  # waiting for the character to end
            self.thinking_tokens += 1
            if whole_character:
                self._force()


class BudgetedSampler(Sampler):
    """A Sampler that obeys a reasoning budget (only built for requests without a grammar: the chat layer
    closes the think block of constrained output before generation starts)."""

    def __init__(self, model: LoadedModel, params: SamplingParams, prompt_tokens: list[int] | None,
                 budget: ReasoningBudget):
        self.tracker = BudgetTracker(budget, model)
        super().__init__(model, params, prompt_tokens)

    def sample(self, ctx: _internals.LlamaContext, row: int) -> int:
        forced = self.tracker.forced_token()
        if forced is None:
            return super().sample(ctx, row)
        self._accept(forced)
        return forced

    def sample_with_candidates(self, ctx: _internals.LlamaContext, row: int, n_probs: int) -> tuple[int, TokenLogprob]:
        forced = self.tracker.forced_token()
        if forced is None:
            return super().sample_with_candidates(ctx, row, n_probs)
        self._accept(forced)
        # every other token's logit was set to -inf: the forced one has all the probability
        piece = self.model.token_piece(forced)
        only = TokenProb(id=forced, token=piece.decode("utf-8", "ignore"), bytes=list(piece), logprob=0.0)
        return forced, TokenLogprob(id=only.id, token=only.token, bytes=only.bytes, logprob=0.0, top_logprobs=[only])

    def _accept(self, token: int) -> None:
        super()._accept(token)
        self.tracker.accept(token)
