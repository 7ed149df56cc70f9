"""The fill-in-the-middle prompt, laid out token by token as llama-server's format_prompt_infill does.

Repo-level pattern (https://arxiv.org/pdf/2409.12186) when the model has FIM_REP/FIM_SEP tokens:
[FIM_REP]myproject\\n [FIM_SEP]file0\\n chunk0 ... [FIM_SEP]filename\\n [FIM_PRE]prefix[FIM_SUF]suffix[FIM_MID]prompt
"""

from __future__ import annotations

from collections.abc import Callable

from kinetic.errors import NotSupportedError

# llama-server's separator between extra chunks when the model has no FIM_SEP token
CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"


def check_fim(fim: dict[str, int]) -> None:
    """llama-server's 501 for a model without the three FIM tokens (only the missing ones named)."""
    missing = "".join(f"{label} token is missing. " for name, label in
                      (("pre", "prefix"), ("suf", "suffix"), ("mid", "middle")) if fim.get(name, -1) < 0)
    if missing:
        raise NotSupportedError(f"Infill is not supported by this model: {missing}")


def infill_tokens(tokenize: Callable[[str], list[int]], fim: dict[str, int], *, prefix: str, suffix: str,
                  extra: tuple[tuple[str, str], ...], prompt: list[int], n_batch: int, n_predict: int,
                  n_ctx: int, bos: int | None, spm: bool = False) -> list[int]:
    """`tokenize` is the plain tokenizer (no BOS, no special parsing); `bos` the token to lead with, if any;
    `spm` (--spm-infill): suffix before prefix, the order some models were trained on."""
    rep, sep = fim.get("rep", -1), fim.get("sep", -1)
    extra_tokens: list[int] = []
    if rep >= 0:
        extra_tokens += [rep, *tokenize("myproject\n")]
    for filename, text in extra:
        if sep >= 0:
            extra_tokens += [sep, *tokenize((filename or "tmp") + "\n")]
        else:
            extra_tokens += tokenize(CHUNK_SEPARATOR)
        extra_tokens += tokenize(text)
    if sep >= 0:
        extra_tokens += [sep, *tokenize("filename\n")]
    prefix_tokens, suffix_tokens = tokenize(prefix), tokenize(suffix)
    # the FIM context fits in one batch, prefix:suffix = 3:1
    n_prefix = min(len(prefix_tokens), 3 * (n_batch // 4))
    n_suffix = min(len(suffix_tokens), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_tokens))
    head = [fim["pre"], *prefix_tokens[len(prefix_tokens) - n_prefix:], *prompt]
    tail = [fim["suf"], *suffix_tokens[:n_suffix]]
    lead = [bos] if bos is not None else []
    first, second = (tail, head) if spm else (head, tail)
    return [*(extra_tokens[len(extra_tokens) - n_extra:] if n_extra else []), *lead, *first, *second, fim["mid"]]
