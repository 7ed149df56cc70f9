"""Per-request LoRA scales on one context: which set of adapter scales each decode step runs with.

llama.cpp sets adapters on a whole context (llama_set_adapters_lora), and the scheduler's slots share one, so a
batch can hold only slots whose requests decode with the same scales (llama-server's can_batch_with). With
several sets in flight (a request with `"lora": [{"id": 0, "scale": 0}]` beside one with the server's), they take
turns step by step, and the context's adapters change only when the set does. llama-server instead serves the
lowest slot's set first, and the others wait until it is done.
"""

from __future__ import annotations

from llama_cpp import _internals

from kinetic.engine.llama.model import LoadedModel
from kinetic.engine.llama.slots import Slot


class AdapterTurns:
    """The adapter scales set on the scheduler's context, and whose turn it is."""

    def __init__(self, model: LoadedModel, ctx: _internals.LlamaContext):
        self.model = model
        self.ctx = ctx
        self.applied = model.lora_scales()  # what new_context set
        self._index = 0

    def next_turn(self, slots: list[Slot]) -> tuple[float, ...]:
        """The scales of this step's batch: the one set among the slots with work, or the sets in turn."""
        wanted = sorted({s.job.lora for s in slots if s.job is not None and not s.job.cancelled
                         and (s.next_token is not None or s.to_evaluate)})
        if len(wanted) <= 1:
            return wanted[0] if wanted else self.applied
        self._index = (self._index + 1) % len(wanted)
        return wanted[self._index]

    def use(self, scales: tuple[float, ...]) -> None:
        """Sets `scales` on the context before a decode, unless they are already set."""
        if scales != self.applied:
            self.model.apply_lora(self.ctx, scales)
            self.applied = scales
