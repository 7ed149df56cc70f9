import random

from kinetic.engine.text import TextAssembler, common_prefix, held_suffix


def test_held_suffix_finds_partial_stop() -> None:
    assert held_suffix("hello wor", ("world",)) == 3
    assert held_suffix("hello", ("world",)) == 0
    assert held_suffix("abc#", ("##", "#end")) == 1


def test_assembler_holds_possible_stop_and_releases_when_not() -> None:
    text = TextAssembler(("###",))
    assert text.push(b"Hello #") == "Hello "
    assert text.push(b"#") == ""
    assert text.push(b"x") == "##x"
    assert text.stopping_word == ""


def test_assembler_cuts_at_stop_and_reports_it() -> None:
    text = TextAssembler(("\n\n", "END"))
    assert text.push(b"one") == "one"
    assert text.push(b" twoEN") == " two"
    assert text.push(b"D more") == ""
    assert text.stopping_word == "END"


def test_assembler_earliest_stop_wins() -> None:
    text = TextAssembler(("b", "a"))
    assert text.push(b"xab") == "x"
    assert text.stopping_word == "a"


def test_assembler_joins_split_utf8() -> None:
    text = TextAssembler()
    encoded = "è".encode()
    assert text.push(encoded[:1]) == ""
    assert text.push(encoded[1:]) == "è"


def test_flush_releases_held_text() -> None:
    text = TextAssembler(("STOP",))
    assert text.push(b"ST") == ""
    assert text.flush() == "ST"


def test_common_prefix_is_the_shared_lead_whatever_the_lengths_and_sequence_types() -> None:
    def by_token(a: list[int], b: list[int]) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    rng = random.Random(7)
    for _ in range(3000):
        a = [rng.randint(0, 2) for _ in range(rng.randint(0, 700))]
        b = a[:rng.randint(0, len(a))] + [rng.randint(0, 2) for _ in range(rng.randint(0, 80))]
        for x, y in ((a, b), (tuple(a), b), (b, tuple(a)), (tuple(b), tuple(a))):
            assert common_prefix(x, y) == by_token(a, b)
