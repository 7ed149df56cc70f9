"""A chat's tokens from the conversation before its last message, tokenized once, and the last message's own.

A class's first turns all render the same conversation before the student's question (the lab's system prompt), and
llama_tokenize costs by the length of the text (it also looks for each special token in all of it: 6414 of them in
Gemma's vocabulary): the lab's 1200-character chat took 0.43 ms in SmolLM2's vocabulary, the question's turn alone
0.08 ms (warm). The conversation before the question is tokenized once (an LRU), and a prompt that starts with it
is tokenized as those tokens, then the rest's.

That is llama_tokenize's own answer when the rest opens with a special token: llama.cpp first cuts the text at its
special tokens, then tokenizes each piece of plain text alone, so the cut at that token is one of its own. What
could still differ lies next to the cut (a special token spanning it, one that strips the whitespace before it), and
that text is the template's, the same for every student and every turn: the first prompt with a given end of the
conversation (its text from its last special token on: the marker that ends a turn) and a given opening token is
tokenized whole as well, and the two are compared; where they differ, that template's prompts are always tokenized
whole. So are those whose next turn opens with text (a template whose markers are no special tokens of the model's
vocabulary: ChatML on Gemma's), which is learned from the first. (Keyed on the conversation's last characters, which
hold the last answer, each later turn of a chat tokenized its prompt once more to check its cut: a 7700-character
chat in SmolLM2's vocabulary took 8.0 ms to render and tokenize on Qwen3.5's template, 3.6 ms keyed so; the
prompt's tokens alone take 2.3 ms.)

A template may render the conversation before the last message otherwise once something follows it, or refuse it
alone (Qwen3.5's: see ChatLayer.earlier_text). The earlier text is then found in the template's rendering of the
whole conversation, cut back to the special token that opens the last message's turn (before_last_special).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

# The end of the earlier text that a special token spanning the cut could start in, where no special token ends it:
# longer than any special token's text in the course's vocabularies.
BOUNDARY_CHARS = 64
BOUNDARIES_KEPT = 256  # each kind: a template has a few, so this many means they keep changing
# Where the special token that ends an earlier text's last turn is looked for: among its last MARKER_TOKENS tokens for
# the boundary's key, and in its last MARKER_CHARS characters for the marker that opens the last message's turn.
MARKER_TOKENS = 16
MARKER_CHARS = 256


class ConversationTokens:
    """`prompt_tokens(text)`: a whole prompt's tokens (with the model's BOS); `rest_tokens(text)`: a later part's
    (no BOS); `piece(token, special)`: a token's text."""

    def __init__(self, prompt_tokens: Callable[[str], list[int]], rest_tokens: Callable[[str], list[int]],
                 piece: Callable[[int, bool], bytes]):
        self._prompt_tokens = prompt_tokens
        self._rest_tokens = rest_tokens
        self._piece = piece
        self.earlier = functools.lru_cache(maxsize=64)(self._tuple_of_tokens)
        # the ends of texts a turn's marker is looked for in: a class's first turns all share one
        self._ends = functools.lru_cache(maxsize=64)(lambda text: tuple(self._rest_tokens(text)))
        self._boundaries: dict[tuple[tuple[bool, str], bytes], bool] = {}  # (_boundary, the opening token): clean
        self._text_after: set[str] = set()  # earlier texts' ends the next turn opens with text after

    def _tuple_of_tokens(self, text: str) -> tuple[int, ...]:
        return tuple(self._prompt_tokens(text))

    def before_last_special(self, text: str) -> str | None:
        """`text` up to the last special token in it (the model's BOS aside), or None where it holds none: the
        marker that opens a template's turn. The head is tokenized on its own when used, never taken as the
        tokens before that marker: a marker that strips the whitespace before it (llama.cpp's lstrip) would
        make the two differ, and `of` checks a cut against the tokens it will use. In a long text the marker is
        looked for in its last MARKER_CHARS characters first (the last message's own markup): a later turn's head
        holds the whole conversation, which is tokenized again for the cut anyway."""
        if len(text) > MARKER_CHARS:
            cut = self._cut_at_last_special(text, self._ends(text[-MARKER_CHARS:]), first=0)
            if cut is not None:
                return cut
        return self._cut_at_last_special(text, self.earlier(text), first=1)

    def _cut_at_last_special(self, text: str, tokens: Sequence[int], *, first: int) -> str | None:
        """`text` up to the last special token among `tokens`, the tokens of its end, at index `first` or after."""
        tail = self._from_last_special(text, tokens, first=first)
        if tail is None:
            return None
        encoded = text.encode("utf-8")
        try:
            return encoded[:len(encoded) - len(tail)].decode("utf-8")
        except UnicodeDecodeError:
            return None

    def _from_last_special(self, text: str, tokens: Sequence[int], *, first: int) -> bytes | None:
        """The text of `tokens` (the tokens of `text`'s end) from the last special token among them, at index
        `first` or after, on; None where there is none, or where the vocabulary changed the text it tokenized."""
        for index in range(len(tokens) - 1, first - 1, -1):
            if self._special_text(tokens[index]):
                tail = b"".join(self._piece(token, True) for token in tokens[index:])
                return tail if text.encode("utf-8").endswith(tail) else None
        return None

    def of(self, prompt: str, earlier: str | None) -> list[int]:
        """`prompt`'s tokens; `earlier` is the conversation before its last message, rendered (None: not known)."""
        if not earlier or not prompt.startswith(earlier) or earlier[-BOUNDARY_CHARS:] in self._text_after:
            return self._prompt_tokens(prompt)
        rest = prompt[len(earlier):]
        if not (rest_tokens := self._rest_tokens(rest)):  # a last message the template renders as nothing
            return self._prompt_tokens(prompt)
        opening = self._opening_special(rest, rest_tokens[0])
        if opening is None:  # the template's next turn opens with text in this vocabulary: never cut here
            if len(self._text_after) >= BOUNDARIES_KEPT:
                self._text_after.clear()
            self._text_after.add(earlier[-BOUNDARY_CHARS:])
            return self._prompt_tokens(prompt)
        before = self.earlier(earlier)
        key = (self._boundary(earlier, before), opening)
        clean = self._boundaries.get(key)
        if clean:
            return [*before, *rest_tokens]
        if clean is None:
            whole = self._prompt_tokens(prompt)
            if len(self._boundaries) >= BOUNDARIES_KEPT:
                self._boundaries.clear()
            self._boundaries[key] = whole == [*before, *rest_tokens]
            return whole
        return self._prompt_tokens(prompt)

    def _boundary(self, earlier: str, tokens: Sequence[int]) -> tuple[bool, str]:
        """What decides the tokens next to a cut after `earlier`: its text from its last special token on (the end
        marker of a turn, and the newline after it, which a template writes the same at every turn), else its last
        BOUNDARY_CHARS characters. llama.cpp tokenizes the text after a special token on its own, so nothing before
        that token can change at the cut. Keyed on characters, every later turn of a chat had a new boundary (its
        last answer's end), checked by tokenizing its prompt whole once more."""
        tail = self._from_last_special(earlier, tokens, first=max(1, len(tokens) - MARKER_TOKENS + 1))  # BOS aside
        if tail is not None:
            return True, tail.decode("utf-8", errors="surrogateescape")
        return False, earlier[-BOUNDARY_CHARS:]

    def _opening_special(self, rest: str, token: int) -> bytes | None:
        """The text of the special token `rest` opens with, or None when it opens otherwise."""
        text = self._special_text(token)
        return text if text and rest.encode("utf-8").startswith(text) else None

    def _special_text(self, token: int) -> bytes | None:
        """A control token's text (it has one only when special tokens are written out), or None for another."""
        text = self._piece(token, True)
        return text if text and not self._piece(token, False) else None
