"""The n-gram drafters beside ngram-simple (kinetic.engine.llama.ngram_drafts, llama.cpp's common/ngram-map.cpp,
ngram-mod.cpp and ngram-cache.cpp): what each proposes from a history, and what verification teaches it. The
e2e side (tests/e2e/test_speculative.py) checks that the output stays the non-speculating server's."""

from __future__ import annotations

from kinetic.config.args import parse_serve_args
from kinetic.engine.llama.ngram_drafts import NgramCache, NgramMap, NgramMod, make_drafters
from kinetic.engine.llama.speculative import Speculator
from kinetic.engine.options import NgramMapOptions, SpecOptions

PERIOD = [11, 12, 13, 14, 15, 16, 17]


def periodic(n: int) -> list[int]:
    return [PERIOD[i % len(PERIOD)] for i in range(n)]


def test_map_k_drafts_the_m_gram_after_the_latest_key_and_learns_its_length() -> None:
    drafter = NgramMap(size_n=3, size_m=4, min_hits=1, key_only=True)
    drafter.begin(0, [])
    history = periodic(30)
    last = PERIOD[30 % 7]
    want = periodic(35)[31:35]  # what followed the key [.., .., last] the latest time a whole m-gram did
    assert drafter.draft(0, history, last) == want
    drafter.accepted(0, 2)  # the next draft of this key stops where the last one failed
    assert drafter.draft(0, history, last) == want[:2]
    assert drafter.draft(0, history[:9], last) == []  # 2n + m tokens of history at least


def test_map_k4v_drafts_only_a_dominant_continuation_after_min_hits() -> None:
    split = [1, 2, 3, 7, 7, 7, 9, 1, 2, 3, 8, 8, 8, 9] + [5] * 12 + [1, 2]
    strict = NgramMap(size_n=3, size_m=3, min_hits=1, key_only=False)
    strict.begin(0, [])
    assert strict.draft(0, split, 3) == []  # [7 7 7] once and [8 8 8] once: neither twice the other
    dominant = [1, 2, 3, 7, 7, 7, 9] * 2 + [5] * 12 + [1, 2]
    drafter = NgramMap(size_n=3, size_m=3, min_hits=1, key_only=False)
    drafter.begin(0, [])
    assert drafter.draft(0, dominant, 3) == [7, 7, 7]
    needy = NgramMap(size_n=3, size_m=3, min_hits=2, key_only=False)
    needy.begin(0, [])
    assert needy.draft(0, dominant, 3) == []  # the first look-up of this key: one hit
    assert needy.draft(0, dominant, 3) == [7, 7, 7]


def test_mod_chains_hashed_n_grams_shared_by_every_sequence() -> None:
    drafter = NgramMod(n_match=4, n_min=3, n_max=6)
    drafter.begin(0, periodic(40))  # sequence 0's prompt fills the table
    drafter.begin(1, [])
    history = periodic(10)
    assert drafter.draft(1, history, PERIOD[10 % 7]) == periodic(17)[11:17]  # sequence 1 drafts from it
    assert drafter.draft(1, [90, 91, 92, 93, 94], 95) == []  # nothing known: under n_min
    for _ in range(5):  # five drafts in a row that mostly failed clear the table
        drafter.draft(1, history, PERIOD[10 % 7])
        drafter.accepted(1, 0)
    assert drafter.entries == {}


def test_cache_drafts_frequent_continuations_up_to_eight_tokens() -> None:
    drafter = NgramCache()
    drafter.begin(0, [])
    history = periodic(40)
    assert drafter.draft(0, history, PERIOD[40 % 7]) == periodic(49)[41:49]
    assert drafter.draft(0, [1, 2, 3, 4], 5) == []  # no n-gram seen before with a following token


def test_a_slot_gets_the_first_kind_with_a_draft_and_that_kind_hears_how_it_went() -> None:
    options = SpecOptions(types=("ngram-cache", "ngram-map-k"), map_k=NgramMapOptions(size_n=3, size_m=4))
    assert list(make_drafters(options)) == ["ngram-map-k", "ngram-cache"]
    speculator = Speculator(options, None)
    assert speculator.types == ("ngram-map-k", "ngram-cache")
    from kinetic.engine.llama.speculative import DraftWanted

    history = periodic(30)
    drafts = speculator.propose([DraftWanted(seq=0, history=history, last=PERIOD[30 % 7], n_max=2)])
    assert drafts == {0: periodic(33)[31:33]}  # map-k's, cut to the room
    speculator.accepted(0, 1)
    mapk = speculator.drafters["ngram-map-k"]
    assert isinstance(mapk, NgramMap) and mapk.last[0] is not None and mapk.last[0][2] == 1


def _drafts_for(args: list[str]) -> dict[str, list[int]]:
    """Each kind's first draft on one periodic history, the drafters built from a command line."""
    options = parse_serve_args(["-m", "m.gguf", "--spec-type", "ngram-map-k,ngram-map-k4v,ngram-mod", *args],
                               environ={}).spec_options()
    history = periodic(200)
    drafts = {}
    for kind, drafter in make_drafters(options).items():
        drafter.begin(0, history[:100])
        drafts[kind] = drafter.draft(0, history, PERIOD[200 % 7])
    return drafts


def test_the_spec_ngram_size_flags_reach_the_drafters_and_change_their_drafts() -> None:
    default = _drafts_for([])
    assert [len(default[k]) for k in ("ngram-map-k", "ngram-map-k4v")] == [48, 48]  # llama-server's size_m
    assert len(default["ngram-mod"]) == 64  # n_max
    sized = _drafts_for(["--spec-ngram-map-k-size-n", "3", "--spec-ngram-map-k-size-m", "5",
                         "--spec-ngram-map-k4v-size-m", "7", "--spec-ngram-mod-n-match", "4",
                         "--spec-ngram-mod-n-min", "2", "--spec-ngram-mod-n-max", "9"])
    assert sized == {"ngram-map-k": periodic(206)[201:206], "ngram-map-k4v": periodic(208)[201:208],
                     "ngram-mod": periodic(210)[201:210]}
    # min hits: a key seen fewer times drafts nothing
    needy = _drafts_for(["--spec-ngram-map-k4v-size-n", "3", "--spec-ngram-map-k4v-size-m", "3",
                         "--spec-ngram-map-k4v-min-hits", "1000"])
    assert needy["ngram-map-k4v"] == []
