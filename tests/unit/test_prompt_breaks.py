"""Where a slot's prompt batch ends (admission.end_breaks, Slot.breaks), without a model: at llama-server's
places before the prompt's end on a model that cannot roll back (recurrent, sliding window), at every
checkpoint, and never before what the slot already holds."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kinetic.engine.llama.admission import CHECKPOINT_END_OFFSET, SlotAdmission, cannot_roll_back, end_breaks
from kinetic.engine.llama.slots import Slot
from kinetic.engine.types import GenerationRequest, MediaSpan


def started_slot(prompt: list[int], n_cached: int, checkpoints: list[int], breaks: list[int],
                 media: tuple[MediaSpan, ...] = ()) -> Slot:
    slot = Slot(id=0)
    job: Any = SimpleNamespace(request=GenerationRequest(prompt_tokens=prompt, media=media), lora=())
    slot.begin(job, n_cached, checkpoints, id_task=1, breaks=breaks)
    return slot


def test_llama_server_ends_a_batch_four_tokens_before_the_end_and_a_ubatch_before_that() -> None:
    assert end_breaks(n_batch=2048, n_ubatch=512, cannot_roll_back=True) == (4 + 512, CHECKPOINT_END_OFFSET)
    # capped at the batch: llama-server's min(n_batch, 4 + n_ubatch)
    assert end_breaks(n_batch=32, n_ubatch=32, cannot_roll_back=True) == (32, 4)
    assert end_breaks(n_batch=2048, n_ubatch=512, cannot_roll_back=False) == ()


def test_a_sliding_window_rolls_back_only_with_swa_full() -> None:
    assert cannot_roll_back(exact_states=False, n_swa=512, swa_full=False)
    assert not cannot_roll_back(exact_states=False, n_swa=512, swa_full=True)
    assert not cannot_roll_back(exact_states=False, n_swa=0, swa_full=False)
    assert cannot_roll_back(exact_states=True, n_swa=0, swa_full=True)  # recurrent states never do


def test_breaks_hold_the_checkpoints_and_start_past_what_the_slot_holds() -> None:
    prompt = list(range(100))
    slot = started_slot(prompt, n_cached=10, checkpoints=[40, 96], breaks=[100 - 36, 96, 5, 10])
    assert slot.breaks == [40, 64, 96]
    assert slot.checkpoints == [40, 96]


def test_the_room_to_the_next_break_skips_breaks_already_passed() -> None:
    slot = started_slot(list(range(20)), n_cached=0, checkpoints=[], breaks=[16])
    assert slot.room_to_break() == 16
    slot.tokens, slot.to_evaluate = slot.prompt[:16], slot.prompt[16:]
    assert slot.room_to_break() == 4  # none left: the rest of the prompt
    # a break an image was evaluated over (media go apart) is dropped, not read as negative room
    slot = started_slot(list(range(20)), n_cached=0, checkpoints=[], breaks=[6, 16])
    slot.tokens, slot.to_evaluate = slot.prompt[:10], slot.prompt[10:]
    assert slot.room_to_break() == 6
    assert slot.breaks == [16]


class Shares(SlotAdmission):
    def __init__(self, slots: list[Slot]) -> None:
        self.slots = slots
        self._prompt_turn = 0


def test_a_steps_prompt_shares_stop_at_each_slots_next_break() -> None:
    a = started_slot(list(range(10)), n_cached=0, checkpoints=[], breaks=[6])
    b = started_slot(list(range(100, 130)), n_cached=0, checkpoints=[], breaks=[26])
    b.id = 1
    shares = dict((slot.id, take) for slot, take in Shares([a, b])._prompt_shares(512, ()))
    assert shares == {0: 6, 1: 26}
