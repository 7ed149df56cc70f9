"""The speculative decoding settings of `kinetic serve` (llama-server's common_params_speculative): a part of
ServerSettings kept apart by concern, and what they ask of the engine (SpecOptions)."""

from __future__ import annotations

import math
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings

from kinetic.config.values import ExistingFile, SpecTypes
from kinetic.engine.options import NgramMapOptions, SpecOptions, parse_spec_types

NgramSize = Annotated[int, Field(ge=1, le=1024)]  # the ranges the vendored common/arg.cpp checks
DraftLength = Annotated[int, Field(ge=0, le=1024)]
MinHits = Annotated[int, Field(ge=1)]
NGRAM_CACHE_DRAFT = 8  # llama.cpp's longest ngram-cache draft (common_speculative_n_max)


def synthetic_rates(rates: tuple[float, ...] | None, length: float | None, n_max: int) -> tuple[float, ...]:
    """llama.cpp's common_speculative_synth_rates_resolve: the unconditional chance that each draft position is
    accepted, given as rates (one per position, non-increasing) or as the mean accepted length L (the target's
    own token included), which makes rates p, p^2, ... with p chosen so that they add up to L - 1."""
    if rates is None and length is None:
        return ()
    if rates is not None and length is not None:
        raise ValueError("--spec-synth-len and --spec-synth-rates are mutually exclusive")
    if n_max <= 0:
        raise ValueError("synthetic acceptance needs at least one speculative token (--spec-draft-n-max)")
    if rates is not None:
        if len(rates) != n_max:
            raise ValueError(f"--spec-synth-rates must contain {n_max} values (--spec-draft-n-max), got {len(rates)}")
        if any(not math.isfinite(r) or not 0.0 <= r <= 1.0 for r in rates):
            raise ValueError("--spec-synth-rates must be finite and within [0, 1]")
        if any(later > earlier for earlier, later in pairwise(rates)):
            raise ValueError("--spec-synth-rates must be monotonically non-increasing")
        return rates
    assert length is not None
    if not math.isfinite(length) or not 1.0 <= length <= n_max + 1:
        raise ValueError(f"--spec-synth-len must be finite and within [1, {n_max + 1}]")
    p = 1.0 if length == n_max + 1 else 0.0
    if 1.0 < length < n_max + 1:  # bisection on p: p + p^2 + ... + p^n_max = L - 1, as llama.cpp's 32 rounds
        low, high = 0.0, 1.0
        for _ in range(32):
            mid = (low + high) / 2
            if sum(mid ** (j + 1) for j in range(n_max)) < length - 1.0:
                low = mid
            else:
                high = mid
        p = (low + high) / 2
    return tuple(p ** (i + 1) for i in range(n_max))


def conditional_probs(rates: tuple[float, ...]) -> tuple[float, ...]:
    """Position i's chance of acceptance once positions 0..i-1 were accepted (llama.cpp's synth_probs)."""
    before = (1.0, *rates)[:len(rates)]
    return tuple(rate / prev if prev > 0.0 else 0.0 for rate, prev in zip(rates, before, strict=True))


class SpeculationSettings(BaseSettings):
    """The fields ServerSettings inherits for speculation; defaults are llama-server's (common/common.h)."""

    draft_model: ExistingFile | None = None
    spec_type: SpecTypes | None = None
    draft_max: Annotated[int, Field(ge=0)] = 3  # llama-server's defaults (common/common.h)
    draft_min: int = 0
    draft_max_old: Annotated[int, Field(ge=0)] | None = None
    draft_min_old: int | None = None
    draft_p_min: float = 0.0
    spec_ngram_simple_size_n: NgramSize = 12
    spec_ngram_simple_size_m: NgramSize = 48
    spec_ngram_map_k_size_n: NgramSize = 12
    spec_ngram_map_k_size_m: NgramSize = 48
    spec_ngram_map_k_min_hits: MinHits = 1
    spec_ngram_map_k4v_size_n: NgramSize = 12
    spec_ngram_map_k4v_size_m: NgramSize = 48
    spec_ngram_map_k4v_min_hits: MinHits = 1
    spec_ngram_mod_n_match: NgramSize = 24
    spec_ngram_mod_n_min: DraftLength = 48
    spec_ngram_mod_n_max: DraftLength = 64
    spec_synth_len: float | None = None  # benchmarking only (llama-server's too): drafts accepted at random
    spec_synth_rates: tuple[float, ...] | None = None

    @field_validator("spec_synth_rates", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        """P0,P1,...: one number a draft position."""
        if isinstance(value, str):
            try:
                return tuple(float(part) for part in value.split(","))
            except ValueError:
                raise ValueError(f"not a comma-separated list of numbers: {value!r}") from None
        return value

    @model_validator(mode="after")
    def _synthetic_acceptance(self) -> SpeculationSettings:
        self._synth_probs()  # refused at start, as llama.cpp refuses them
        return self

    @property
    def _n_max(self) -> int:
        return self.draft_max if self.draft_max_old is None else self.draft_max_old

    def _types(self) -> tuple[str, ...]:
        if self.spec_type is not None:
            return parse_spec_types(self.spec_type)
        return ("draft-simple",) if self.draft_model else ()  # llama-server's older meaning of -md alone

    def _synth_probs(self) -> tuple[float, ...]:
        """The chance of each draft position (--spec-synth-*), over the longest draft the kinds asked can make
        (llama.cpp's common_speculative_n_max); nothing when nothing speculates."""
        drafts = {"draft-simple": self._n_max, "ngram-simple": self.spec_ngram_simple_size_m,
                  "ngram-map-k": self.spec_ngram_map_k_size_m, "ngram-map-k4v": self.spec_ngram_map_k4v_size_m,
                  "ngram-mod": self.spec_ngram_mod_n_max, "ngram-cache": NGRAM_CACHE_DRAFT}
        types = self._types()
        if not types:
            return ()
        n_max = max(drafts.get(kind, self._n_max) for kind in types)  # the draft heads: --spec-draft-n-max
        return conditional_probs(synthetic_rates(self.spec_synth_rates, self.spec_synth_len, n_max))

    def spec_options(self) -> SpecOptions:
        """What the speculative decoding flags ask; -md without --spec-type means draft-simple (as on
        llama-server before --spec-type, and what a model card's `-md X --draft-max N` expects)."""
        return SpecOptions(types=self._types(), draft_model=str(Path(self.draft_model).expanduser()) if self.draft_model
                           else None, n_max=self._n_max,
                           n_min=self.draft_min if self.draft_min_old is None else self.draft_min_old,
                           p_min=self.draft_p_min,
                           synth_probs=self._synth_probs(),
                           ngram_size_n=self.spec_ngram_simple_size_n, ngram_size_m=self.spec_ngram_simple_size_m,
                           map_k=NgramMapOptions(size_n=self.spec_ngram_map_k_size_n,
                                                 size_m=self.spec_ngram_map_k_size_m,
                                                 min_hits=self.spec_ngram_map_k_min_hits),
                           map_k4v=NgramMapOptions(size_n=self.spec_ngram_map_k4v_size_n,
                                                   size_m=self.spec_ngram_map_k4v_size_m,
                                                   min_hits=self.spec_ngram_map_k4v_min_hits),
                           mod_n_match=self.spec_ngram_mod_n_match, mod_n_min=self.spec_ngram_mod_n_min,
                           mod_n_max=self.spec_ngram_mod_n_max)
