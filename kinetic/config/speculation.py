"""The speculative decoding settings of `kinetic serve` (llama-server's common_params_speculative): a part of
ServerSettings kept apart by concern, and what they ask of the engine (SpecOptions)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field
from pydantic_settings import BaseSettings

from kinetic.config.values import ExistingFile, SpecTypes
from kinetic.engine.options import NgramMapOptions, SpecOptions, parse_spec_types

NgramSize = Annotated[int, Field(ge=1, le=1024)]  # the ranges the vendored common/arg.cpp checks
DraftLength = Annotated[int, Field(ge=0, le=1024)]
MinHits = Annotated[int, Field(ge=1)]


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

    def spec_options(self) -> SpecOptions:
        """What the speculative decoding flags ask; -md without --spec-type means draft-simple (as on
        llama-server before --spec-type, and what a model card's `-md X --draft-max N` expects)."""
        if self.spec_type is not None:
            types = parse_spec_types(self.spec_type)
        else:
            types = ("draft-simple",) if self.draft_model else ()
        return SpecOptions(types=types, draft_model=str(Path(self.draft_model).expanduser()) if self.draft_model
                           else None, n_max=self.draft_max if self.draft_max_old is None else self.draft_max_old,
                           n_min=self.draft_min if self.draft_min_old is None else self.draft_min_old,
                           p_min=self.draft_p_min,
                           ngram_size_n=self.spec_ngram_simple_size_n, ngram_size_m=self.spec_ngram_simple_size_m,
                           map_k=NgramMapOptions(size_n=self.spec_ngram_map_k_size_n,
                                                 size_m=self.spec_ngram_map_k_size_m,
                                                 min_hits=self.spec_ngram_map_k_min_hits),
                           map_k4v=NgramMapOptions(size_n=self.spec_ngram_map_k4v_size_n,
                                                   size_m=self.spec_ngram_map_k4v_size_m,
                                                   min_hits=self.spec_ngram_map_k4v_min_hits),
                           mod_n_match=self.spec_ngram_mod_n_match, mod_n_min=self.spec_ngram_mod_n_min,
                           mod_n_max=self.spec_ngram_mod_n_max)
