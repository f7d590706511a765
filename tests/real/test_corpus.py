"""posenc.real.corpus: windows that end alike at every length, inside one document, never scoring a token
twice."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from posenc.real.corpus import Document, Window, choose_windows, load_documents, window_ids

from .fake_tokenizer import CharTokenizer


@given(
    sizes=st.lists(st.integers(1, 400), min_size=1, max_size=6),
    count=st.integers(1, 12),
    need=st.integers(2, 200),
    tail=st.integers(1, 50),
)
def test_windows_fit_their_document_and_their_scored_tails_are_disjoint(sizes, count, need, tail):
    docs = [Document(f"d{i}", np.arange(n)) for i, n in enumerate(sizes)]
    # how many windows fit: per document, ends at n, n - tail, ... while >= need
    room = sum(max(0, (n - need) // tail + 1) for n in sizes if n >= need)
    if room < count:
        with pytest.raises(ValueError, match=f"--windows {count}: the corpus holds only"):
            choose_windows(docs, count, need, tail)
        return
    windows = choose_windows(docs, count, need, tail)
    assert len(windows) == count
    for w in windows:
        assert need <= w.end <= sizes[w.document]
    for d in range(len(docs)):
        ends = sorted(w.end for w in windows if w.document == d)
        assert all(b - a >= tail for a, b in zip(ends, ends[1:], strict=False))
    firsts = [w for w in windows if w.end == sizes[w.document]]  # one from each long document first
    long_docs = [i for i, n in enumerate(sizes) if n >= need]
    assert [w.document for w in firsts] == long_docs[: len(firsts)]
    assert len(firsts) == min(count, len(long_docs))


def test_a_window_is_the_start_tokens_then_the_text_that_ends_at_its_end():
    doc = Document("d", np.arange(100, 200))
    assert window_ids(doc, Window(0, 90), 5, []) == [185, 186, 187, 188, 189]
    assert window_ids(doc, Window(0, 90), 5, [1]) == [1, 186, 187, 188, 189]


def test_documents_are_the_largest_files_that_hold_the_tokens(tmp_path):
    for name, size in (("a.txt", 50), ("b.txt", 300), ("c.txt", 200), ("d.txt", 10)):
        (tmp_path / name).write_text("x" * size)
    docs = load_documents(tmp_path, CharTokenizer(), min_tokens=40)
    assert [(d.name, len(d.tokens)) for d in docs] == [("b.txt", 300), ("c.txt", 200), ("a.txt", 50)]
    assert [d.name for d in load_documents(tmp_path, CharTokenizer(), 40, enough=2)] == ["b.txt", "c.txt"]
    single = load_documents(tmp_path / "c.txt", CharTokenizer(), 40)
    assert [d.name for d in single] == ["c.txt"]
    with pytest.raises(
        ValueError, match=r"no document has the 400 tokens .* \(the largest file has 300 bytes\)"
    ):
        load_documents(tmp_path, CharTokenizer(), 400)
    two_bytes_a_token = lambda text, **kw: {"input_ids": list(range(len(text) // 2))}  # noqa: E731
    with pytest.raises(ValueError, match=r"no document has the 150 tokens .* \(the longest has 100 tokens\)"):
        load_documents(tmp_path / "c.txt", two_bytes_a_token, 150)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="is a folder without text files"):
        load_documents(tmp_path / "empty", CharTokenizer(), 4)
    with pytest.raises(ValueError, match="does not exist"):
        load_documents(tmp_path / "nothing", CharTokenizer(), 4)
