"""A chat's tokens from the conversation before its last message, tokenized once, and the last message's own.

A class's first turns all render the same conversation before the student's question (the lab's system prompt), and
llama_tokenize costs by the length of the text (it also looks for each special token in all of it: 6414 of them in
Gemma's vocabulary): the lab's 1200-character chat took 0.43 ms in SmolLM2's vocabulary, the question's turn alone
0.08 ms (warm). The conversation before the question is tokenized once (an LRU), and a prompt that starts with it
is tokenized as those tokens, then the rest's.

That is llama_tokenize's own answer when the rest opens with a special token: llama.cpp first cuts the text at its
special tokens, then tokenizes each piece of plain text alone, so the cut at that token is one of its own. What
could still differ lies next to the cut (a special token spanning it, one that strips the whitespace before it), and
that text is the template's, the same for every student: the first prompt with a given end of the conversation and a
given opening token is tokenized whole as well, and the two are compared; where they differ, that template's prompts
are always tokenized whole. So are those whose next turn opens with text (a template whose markers are no special
tokens of the model's vocabulary: ChatML on Gemma's), which is learned from the first.

A template may render the conversation before the last message otherwise once something follows it, or refuse it
alone (Qwen3.5's: see ChatLayer.earlier_text). The earlier text is then found in the template's rendering of the
whole conversation, cut back to the special token that opens the last message's turn (before_last_special).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

# The end of the earlier text that a special token spanning the cut could start in: longer than any special token's
# text in the course's vocabularies.
BOUNDARY_CHARS = 64
BOUNDARIES_KEPT = 256  # each kind: a template has a few, so this many means they keep changing


class ConversationTokens:
    """`prompt_tokens(text)`: a whole prompt's tokens (with the model's BOS); `rest_tokens(text)`: a later part's
    (no BOS); `piece(token, special)`: a token's text."""

    def __init__(self, prompt_tokens: Callable[[str], list[int]], rest_tokens: Callable[[str], list[int]],
                 piece: Callable[[int, bool], bytes]):
        self._prompt_tokens = prompt_tokens
        self._rest_tokens = rest_tokens
        self._piece = piece
        self.earlier = functools.lru_cache(maxsize=64)(self._tuple_of_tokens)
        self._boundaries: dict[tuple[str, bytes], bool] = {}  # (the earlier text's end, the opening token): clean
        self._text_after: set[str] = set()  # earlier texts' ends the next turn opens with text after

    def _tuple_of_tokens(self, text: str) -> tuple[int, ...]:
        return tuple(self._prompt_tokens(text))

    def before_last_special(self, text: str) -> str | None:
        """`text` up to the last special token in it (the model's BOS aside), or None where it holds none: the
        marker that opens a template's turn. The head is tokenized on its own when used, never taken as the
        tokens before that marker: a marker that strips the whitespace before it (llama.cpp's lstrip) would
        make the two differ, and `of` checks a cut against the tokens it will use."""
        tokens = self.earlier(text)
        for index in range(len(tokens) - 1, 0, -1):
            if self._special_text(tokens[index]):
                break
        else:
            return None
        tail = b"".join(self._piece(token, True) for token in tokens[index:])
        encoded = text.encode("utf-8")
        if not encoded.endswith(tail):  # a vocabulary that changes the text it tokenizes
            return None
        try:
            return encoded[:len(encoded) - len(tail)].decode("utf-8")
        except UnicodeDecodeError:
            return None

    def of(self, prompt: str, earlier: str | None) -> list[int]:
        """`prompt`'s tokens; `earlier` is the conversation before its last message, rendered (None: not known)."""
        if earlier and prompt.startswith(earlier) and (tail := earlier[-BOUNDARY_CHARS:]) not in self._text_after:
            rest = prompt[len(earlier):]
            if not (rest_tokens := self._rest_tokens(rest)):  # a last message the template renders as nothing
                return self._prompt_tokens(prompt)
            opening = self._opening_special(rest, rest_tokens[0])
            if opening is None:  # the template's next turn opens with text in this vocabulary: never cut here
                if len(self._text_after) >= BOUNDARIES_KEPT:
                    self._text_after.clear()
                self._text_after.add(tail)
                return self._prompt_tokens(prompt)
            clean = self._boundaries.get((tail, opening))
            if clean:
                return list(self.earlier(earlier)) + rest_tokens
            if clean is None:
                whole = self._prompt_tokens(prompt)
                if len(self._boundaries) >= BOUNDARIES_KEPT:
                    self._boundaries.clear()
                self._boundaries[tail, opening] = whole == list(self.earlier(earlier)) + rest_tokens
                return whole
        return self._prompt_tokens(prompt)

    def _opening_special(self, rest: str, token: int) -> bytes | None:
        """The text of the special token `rest` opens with, or None when it opens otherwise."""
        text = self._special_text(token)
        return text if text and rest.encode("utf-8").startswith(text) else None

    def _special_text(self, token: int) -> bytes | None:
        """A control token's text (it has one only when special tokens are written out), or None for another."""
        text = self._piece(token, True)
        return text if text and not self._piece(token, False) else None
