"""The watch stream's line splitter: any chunking of a stream gives back its non-empty lines."""

from __future__ import annotations

from collections.abc import Iterator

from hypothesis import given
from hypothesis import strategies as st

from gpusched.k8s.informer import _lines


class Stream:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def stream(self, amt: int, decode_content: bool) -> Iterator[bytes]:
        yield from self.chunks


@given(
    st.lists(st.binary(min_size=0, max_size=40).map(lambda b: b.replace(b"\n", b"x")), max_size=20),
    st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=30),
    st.booleans(),
)
def test_any_chunking_gives_the_lines(lines: list[bytes], cuts: list[int], final_newline: bool) -> None:
    data = b"\n".join(lines) + (b"\n" if final_newline else b"")
    chunks, i = [], 0
    for c in cuts * (len(data) // max(1, sum(cuts)) + 1):
        if i >= len(data):
            break
        chunks.append(data[i : i + c])
        i += c
    assert list(_lines(Stream(chunks))) == [ln for ln in lines if ln.strip()]
