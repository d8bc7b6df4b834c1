"""Token bytes to text: UTF-8 split across tokens, and stop strings split across tokens."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from localinfer.runtime.text import TextAssembler


def feed(chunks: list[bytes], stop: tuple[str, ...] = ()) -> tuple[str, TextAssembler]:
    a = TextAssembler(stop)
    out = "".join(a.push(c) for c in chunks)
    out += a.flush()
    return out, a


def test_multibyte_character_split_across_tokens():
    data = "héllo 🙂".encode()
    out, _ = feed([data[i : i + 1] for i in range(len(data))])
    assert out == "héllo 🙂"


def test_stop_string_across_tokens_is_cut_and_never_shown():
    a = TextAssembler(("</s>",))
    shown = [a.push(b"Hello <"), a.push(b"/"), a.push(b"s> more")]
    assert "".join(shown) == "Hello "
    assert a.stopped and a.text == "Hello "
    assert a.push(b"anything") == "" and a.flush() == ""


def test_held_back_prefix_is_released_when_it_turns_out_not_to_be_a_stop():
    a = TextAssembler(("STOP",))
    assert a.push(b"go ST") == "go "
    assert a.push(b"ART") == "START"
    assert not a.stopped


def test_earliest_of_several_stop_strings_wins():
    out, a = feed([b"a b c d"], stop=("c", "b"))
    assert out == "a " and a.stopped


@given(
    text=st.text(alphabet="ab\n é🙂", max_size=40),
    stops=st.lists(st.text(alphabet="ab\n é🙂", min_size=1, max_size=3), max_size=3),
    cuts=st.lists(st.integers(0, 200), max_size=10),
)
def test_output_is_the_text_up_to_the_first_stop(text, stops, cuts):
    data = text.encode()
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in itertools.pairwise(points)]
    out, _ = feed(chunks, tuple(stops))
    first = min((i for i in (text.find(s) for s in stops) if i != -1), default=len(text))
    assert out == text[:first]
