"""Texts layer: TextSet, file loaders, seeded limits, errors, wiki cleaning, built-in corpora, CLI."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import types
from collections import Counter

import numpy as np
import pandas as pd
import pytest
from support.texts import (
    builtins,  # noqa: F401 (a fixture)
    gensim_wheel,  # noqa: F401 (a fixture)
    one_line,
    private_cache,  # noqa: F401 (a fixture)
)

from lmgeom.cli import main
from lmgeom.errors import TextsError
from lmgeom.texts import (
    BUILTIN_NAMES,
    SUPPORTED_EXTENSIONS,
    TextSet,
    as_textset,
    fetch_builtin,
    list_builtin,
    load_texts,
    sample_indices,
)
from lmgeom.texts import builtin as B
from lmgeom.texts.cleaning import (
    clean_wikitext,
    detokenize,
    n_words,
    pack_paragraphs,
    split_sentences,
    strip_markup_residue_check,
)


def _ts(n=6, labels=True):
    return TextSet(
        ids=tuple(f"id{i}" for i in range(n)),
        texts=tuple(f"text number {i}" for i in range(n)),
        labels=tuple("ab"[i % 2] for i in range(n)) if labels else None,
        source="test",
    )


def test_textset_indexing_and_subset():
    ts = _ts()
    assert len(ts) == 6 and ts[2] == "text number 2" and ts[-1] == "text number 5"
    assert list(ts) == list(ts.texts)
    sl = ts[1:5:2]
    assert isinstance(sl, TextSet) and sl.ids == ("id1", "id3") and sl.labels == ("b", "b")
    arr = ts[np.array([4, 0])]
    assert arr.ids == ("id4", "id0") and arr.texts == ("text number 4", "text number 0")
    mask = ts[np.array([True, False] * 3)]
    assert mask.ids == ("id0", "id2", "id4")
    assert ts.subset([5, -6]).ids == ("id5", "id0")
    assert ts.label_names == ("a", "b") and ts.label_counts() == {"a": 3, "b": 3}
    assert _ts(labels=False).label_names is None
    with pytest.raises(TextsError, match="out of range"):
        ts.subset([6])
    with pytest.raises(TextsError, match="repeat"):
        ts.subset([1, 1])


def test_textset_validation():
    with pytest.raises(TextsError, match="one id per text"):
        TextSet(ids=("a",), texts=("x", "y"))
    with pytest.raises(TextsError, match="one label per text"):
        TextSet(ids=("a", "b"), texts=("x", "y"), labels=("l",))
    with pytest.raises(TextsError, match="unique"):
        TextSet(ids=("a", "a"), texts=("x", "y"))
    with pytest.raises(TextsError, match="strings"):
        TextSet(ids=("a", "b"), texts=("x", 3))


def test_textset_hash_is_content_hash():
    a, b = _ts(), _ts()
    assert a.hash == b.hash and len(a.hash) == 64 and a == b
    assert TextSet(a.ids, a.texts, a.labels, source="other").hash == a.hash  # source not content
    changed_text = TextSet(a.ids, a.texts[:-1] + ("text number 55",), a.labels)
    changed_id = TextSet(a.ids[:-1] + ("idX",), a.texts, a.labels)
    changed_label = TextSet(a.ids, a.texts, a.labels[:-1] + ("a",))
    unlabeled = TextSet(a.ids, a.texts, None)
    hashes = {a.hash, changed_text.hash, changed_id.hash, changed_label.hash, unlabeled.hash}
    assert len(hashes) == 5
    # no ambiguity from concatenation: ("ab", "c") vs ("a", "bc")
    assert TextSet(("1", "2"), ("ab", "c")).hash != TextSet(("1", "2"), ("a", "bc")).hash


def test_textset_to_frame():
    df = _ts().to_frame()
    assert list(df.columns) == ["id", "text", "label", "n_words"]
    assert df["n_words"].tolist() == [3] * 6 and df["id"].iloc[3] == "id3"
    assert "label" not in _ts(labels=False).to_frame().columns


def test_as_textset():
    ts = as_textset(["alpha", "beta", "  ", "gamma"])
    assert ts.ids == ("0", "1", "3") and ts.texts == ("alpha", "beta", "gamma")
    assert ts.source == "list" and ts.n_dropped == 1 and ts.labels is None
    same = _ts()
    assert as_textset(same) is same
    assert as_textset(("x", "y")).ids == ("0", "1")
    with pytest.raises(TextsError, match="cannot make a TextSet"):
        as_textset(42)
    with pytest.raises(TextsError, match="not a string"):
        as_textset(["ok", 3])


def test_as_textset_spec(tmp_path):
    p = tmp_path / "c.txt"
    p.write_text("one\ntwo\nthree\n", encoding="utf-8")
    ts = as_textset(str(p), limit=2, seed=1)
    assert len(ts) == 2 and set(ts.texts) <= {"one", "two", "three"}
    assert as_textset(p).texts == ("one", "two", "three")


ROWS = [
    {"id": "r1", "text": "The first text, with a comma.", "label": "pos"},
    {"id": "r2", "text": 'A "quoted" second text\nover two lines.', "label": "neg"},
    {"id": "r3", "text": "Ünïcödé third text — ok.", "label": "pos"},
]


def _expect_rows(ts: TextSet) -> None:
    assert ts.ids == tuple(r["id"] for r in ROWS)
    assert ts.texts == tuple(r["text"] for r in ROWS)
    assert ts.labels == tuple(r["label"] for r in ROWS)
    assert ts.n_dropped == 0


def test_jsonl_roundtrip(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in ROWS) + "\n\n", "utf-8")
    _expect_rows(load_texts(p))


def test_csv_tsv_parquet_roundtrip(tmp_path):
    df = pd.DataFrame(ROWS)
    df.to_csv(tmp_path / "c.csv", index=False)
    df.to_csv(tmp_path / "c.tsv", index=False, sep="\t")
    df.to_parquet(tmp_path / "c.parquet", index=False)
    for ext in ("csv", "tsv", "parquet"):
        ts = load_texts(str(tmp_path / f"c.{ext}"))
        _expect_rows(ts)
        assert ts.source == f"file:{tmp_path / f'c.{ext}'}"


def test_table_column_choice(tmp_path):
    # no "text" column: the only string column is used; numeric labels become strings
    pd.DataFrame({"body": ["a b c", "d e f"], "label": [0, 1], "score": [0.5, 0.7]}).to_parquet(
        tmp_path / "t.parquet"
    )
    ts = load_texts(tmp_path / "t.parquet")
    assert ts.texts == ("a b c", "d e f") and ts.labels == ("0", "1") and ts.ids == ("0", "1")
    # explicit columns
    p = tmp_path / "e.jsonl"
    p.write_text(
        '{"q": "why?", "a": "because", "cat": "x"}\n{"q": "how?", "a": "so", "cat": "y"}\n'
    )
    ts = load_texts(p, text_column="a", label_column="cat")
    assert ts.texts == ("because", "so") and ts.labels == ("x", "y")
    assert load_texts(p, text_column="q").labels is None


def test_txt_lines_and_paragraphs(tmp_path):
    p = tmp_path / "doc.txt"
    p.write_text(
        "First paragraph line one\nline two of it.\n\n   \nSecond paragraph.\n\n\nThird\nhas\nthree.\n",
        encoding="utf-8",
    )
    lines = load_texts(p)
    assert lines.texts == (
        "First paragraph line one",
        "line two of it.",
        "Second paragraph.",
        "Third",
        "has",
        "three.",
    )
    assert lines.n_dropped == 4  # 4 blank lines; ids keep the original line positions
    assert lines.ids == ("0", "1", "4", "7", "8", "9")
    paras = load_texts(p, split="paragraphs")
    assert paras.texts == (
        "First paragraph line one\nline two of it.",
        "Second paragraph.",
        "Third\nhas\nthree.",
    )
    assert paras.ids == ("0", "1", "2") and paras.n_dropped == 0
    with pytest.raises(TextsError, match="lines, paragraphs"):
        load_texts(p, split="sentences")


def test_crlf_and_bom(tmp_path):
    p = tmp_path / "w.txt"
    p.write_bytes("\ufeffone\r\ntwo\r\n".encode())
    assert load_texts(p).texts == ("one", "two")


def test_error_empty_corpus(tmp_path):
    p = tmp_path / "blank.txt"
    p.write_text("  \n\t\n\n", encoding="utf-8")
    with pytest.raises(TextsError, match="has no texts") as e:
        load_texts(p)
    assert "3 empty" in one_line(e)
    q = tmp_path / "blank.jsonl"
    q.write_text('{"text": " "}\n{"text": null}\n')
    with pytest.raises(TextsError, match="has no texts"):
        load_texts(q)
    with pytest.raises(TextsError, match="has no texts"):
        as_textset(["", "   "])


def test_empty_texts_dropped_counted_logged(tmp_path, caplog):
    p = tmp_path / "c.csv"
    pd.DataFrame({"text": ["keep me", "", "   ", "me too"]}).to_csv(p, index=False)
    with caplog.at_level(logging.WARNING, logger="lmgeom.texts"):
        ts = load_texts(p)
    assert ts.texts == ("keep me", "me too") and ts.ids == ("0", "3") and ts.n_dropped == 2
    assert any("dropped 2 empty" in r.getMessage() for r in caplog.records)


def test_error_non_utf8(tmp_path):
    p = tmp_path / "latin1.txt"
    p.write_bytes(b"fine line\ncaf\xe9 au lait\n")
    with pytest.raises(TextsError) as e:
        load_texts(p)
    msg = one_line(e)
    assert str(p) in msg and "byte offset 13" in msg and "UTF-8" in msg
    q = tmp_path / "bad.csv"
    q.write_bytes(b"text\nok\n\xff\xfe\n")
    with pytest.raises(TextsError, match=r"byte offset 8"):
        load_texts(q)


def test_error_bad_jsonl_line(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"text": "a"}\n\n{"text": "b"}\n{"text": "c",,}\n')
    with pytest.raises(TextsError, match="line 4 is not valid JSON") as e:
        load_texts(p)
    one_line(e)
    q = tmp_path / "arr.jsonl"
    q.write_text('{"text": "a"}\n[1, 2]\n')
    with pytest.raises(TextsError, match="line 2 is a JSON array"):
        load_texts(q)


def test_error_missing_columns(tmp_path):
    p = tmp_path / "c.csv"
    pd.DataFrame({"body": ["x"], "title": ["y"], "n": [1]}).to_csv(p, index=False)
    with pytest.raises(TextsError) as e:
        load_texts(p)  # two string columns, none called "text"
    msg = one_line(e)
    assert "'body', 'title', 'n'" in msg and "text_column" in msg
    with pytest.raises(TextsError, match=r"no text column 'content'; available columns: 'body'"):
        load_texts(p, text_column="content")
    with pytest.raises(TextsError, match=r"no label column 'label'; available columns: 'body'"):
        load_texts(p, text_column="body", label_column="label")
    q = tmp_path / "num.jsonl"
    q.write_text('{"text": 5}\n')
    with pytest.raises(TextsError, match="holds a number in line 1"):
        load_texts(q)
    r = tmp_path / "lab.jsonl"
    r.write_text('{"text": "a", "label": "x"}\n{"text": "b"}\n')
    with pytest.raises(TextsError, match="label column 'label' is empty in line 2"):
        load_texts(r)


def test_error_missing_path_unknown_ext_and_builtin(tmp_path):
    with pytest.raises(TextsError, match="no such file") as e:
        load_texts(tmp_path / "nope.txt")
    one_line(e)
    bad = tmp_path / "c.docx"
    bad.write_text("x")
    with pytest.raises(TextsError) as e:
        load_texts(bad)
    msg = one_line(e)
    assert "'.docx'" in msg and all(ext in msg for ext in SUPPORTED_EXTENSIONS)
    with pytest.raises(TextsError, match="is a directory"):
        load_texts(tmp_path)
    with pytest.raises(TextsError) as e:
        load_texts("builtin:nonsense")
    msg = one_line(e)
    assert all(f"builtin:{n}" in msg for n in BUILTIN_NAMES)
    with pytest.raises(TextsError, match="takes no split"):
        load_texts("builtin:news", split="train")
    (tmp_path / "x.csv").write_text("text\na\n")
    with pytest.raises(TextsError, match="only applies to .txt"):
        load_texts(tmp_path / "x.csv", split="train")


def test_error_hf_without_datasets(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets → ImportError
    with pytest.raises(TextsError, match="needs the 'datasets' package") as e:
        load_texts("hf:ag_news")
    assert "builtin:" in one_line(e)


def test_error_hf_hub_unreachable(monkeypatch):
    fake = types.ModuleType("datasets")
    calls = []

    def load_dataset(name, config=None, split=None):
        calls.append((name, config, split))
        raise ConnectionError("Couldn't reach 'ag_news' on the Hub (LocalEntryNotFoundError)")

    fake.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", fake)
    with pytest.raises(TextsError, match="hub may be unreachable") as e:
        load_texts("hf:ag_news:default:test")
    assert "builtin:" in one_line(e) and calls == [("ag_news", "default", "test")]
    with pytest.raises(TextsError, match="not a dataset spec"):
        load_texts("hf:a:b:c:d")


def test_hf_loader_with_fake_dataset(monkeypatch):
    """The hf path maps ClassLabel ints to names and picks the train split."""

    class ClassLabel:
        def __init__(self, names):
            self.names = names

    class DS:
        def __init__(self):
            self.features = {"text": object(), "label": ClassLabel(["world", "sports"])}

        def to_pandas(self):
            return pd.DataFrame({"text": ["a match", "a summit"], "label": [1, 0]})

    fake = types.ModuleType("datasets")
    fake.load_dataset = lambda name, config=None, split=None: {"test": DS(), "train": DS()}
    monkeypatch.setitem(sys.modules, "datasets", fake)
    ts = load_texts("hf:ag_news")
    assert ts.texts == ("a match", "a summit") and ts.labels == ("sports", "world")
    assert ts.source == "hf:ag_news:train"


def test_limit_deterministic_and_ordered(tmp_path):
    p = tmp_path / "c.txt"
    p.write_text("".join(f"line {i}\n" for i in range(200)))
    a = load_texts(p, limit=20, seed=7)
    b = load_texts(p, limit=20, seed=7)
    c = load_texts(p, limit=20, seed=8)
    assert a == b and a.hash == b.hash and len(a) == 20
    assert a.ids != c.ids
    pos = [int(i) for i in a.ids]
    assert pos == sorted(pos)  # original order kept
    assert "limit 20, seed 7" in a.source
    assert load_texts(p, limit=200) == load_texts(p) == load_texts(p, limit=10_000)
    with pytest.raises(TextsError, match="positive integer"):
        load_texts(p, limit=0)


def test_limit_balanced_labels():
    labels = ["a"] * 3 + ["b"] * 50 + ["c"] * 20
    idx = sample_indices(len(labels), 21, labels=labels, seed=0)
    assert Counter(labels[i] for i in idx) == {"a": 3, "b": 9, "c": 9}
    idx = sample_indices(len(labels), 30, labels=labels, seed=0)
    assert Counter(labels[i] for i in idx) == {"a": 3, "b": 14, "c": 13} or Counter(
        labels[i] for i in idx
    ) == {"a": 3, "b": 13, "c": 14}
    assert len(set(idx.tolist())) == 30 and list(idx) == sorted(idx)
    even = sample_indices(len(labels), 9, labels=labels, seed=3)
    assert Counter(labels[i] for i in even) == {"a": 3, "b": 3, "c": 3}
    ts = TextSet(tuple(map(str, range(73))), tuple(f"t{i}" for i in range(73)), tuple(labels))
    from lmgeom.texts import limit_textset

    sub = limit_textset(ts, 12, seed=5)
    assert sub.label_counts() == {"a": 3, "b": 5, "c": 4} or sub.label_counts() == {
        "a": 3,
        "b": 4,
        "c": 5,
    }


WIKI = """{{Infobox person
| name = Ada {{nowrap|Lovelace}}
| image = Ada.jpg
}}
'''Ada Lovelace''' (10 December 1815&nbsp;– 27 November 1852) was an English [[mathematician]] and [[Writer|writer]],<ref name="b">{{cite book |title=Ada}}</ref> chiefly known for her work on the [[Analytical Engine]].<ref>Toole, p. 3</ref> She was {{convert|1.6|m}} tall.

[[File:Ada Lovelace portrait.jpg|thumb|left|Portrait of [[Ada Lovelace|Ada]] by
[[Alfred Edward Chalon]] [1840]]]
== Early life ==
{| class="wikitable"
|-
| cell || 1815
|}
Her father was [[Lord Byron]]. <!-- hidden --> She had a &quot;poetical science&quot;.
* short item
* A list item that is long enough to be a sentence about her life and work.

== References ==
{{reflist}}
* [http://example.org Some source] about Ada
== External links ==
* [[Wikipedia:Foo|foo]]
[[Category:1815 births]]
[[de:Ada Lovelace]]
"""


def test_clean_wikitext():
    paras = clean_wikitext(WIKI)
    text = "\n".join(paras)
    assert strip_markup_residue_check(paras) == []
    assert paras[0].startswith("Ada Lovelace (10 December 1815 – 27 November 1852) was an English")
    assert "mathematician and writer, chiefly known for her work on the Analytical Engine." in text
    assert "She was 1.6 m tall." in text
    assert 'Her father was Lord Byron. She had a "poetical science".' in text
    assert "A list item that is long enough" in text
    for gone in (
        "short item",
        "Portrait",
        "thumb",
        "cell",
        "Toole",
        "Some source",
        "Category",
        "1815 births",
        "de:",
        "hidden",
        "Infobox",
        "Early life",
        "References",
        "foo",
    ):
        assert gone not in text, gone


def test_pack_paragraphs_bounds_and_order():
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(5000)]
    paras, pos = [], 0
    for n in rng.integers(3, 700, size=40):
        chunk = words[pos : pos + n]
        pos += n
        # sentences of 8 words
        paras.append(" ".join(w + ("." if (k + 1) % 8 == 0 else "") for k, w in enumerate(chunk)))
    out = pack_paragraphs(paras, min_words=60, max_words=400, min_keep=1)
    assert all(n_words(p) <= 400 for p in out)
    assert sum(n_words(p) < 60 for p in out) <= 2
    flat = " ".join(out).replace(".", "").split()
    assert flat == " ".join(paras).replace(".", "").split()  # nothing lost, order kept


def test_split_sentences_and_detokenize():
    s = "Dr. Smith arrived at 5 p.m. on Monday. He left, e.g. early! Did he? Yes."
    assert split_sentences(s) == [
        "Dr. Smith arrived at 5 p.m. on Monday.",
        "He left, e.g. early!",
        "Did he?",
        "Yes.",
    ]
    assert detokenize("it 's so funny , really ( not ) .") == "it's so funny, really (not)."


def test_builtin_sizes(builtins):
    for name, ts in builtins.items():
        assert len(ts) >= 100, name
        assert len(set(ts.ids)) == len(ts)
        assert ts.source.startswith(f"builtin:{name} (")
        assert all(t.strip() for t in ts.texts)
    for name in ("wiki", "science", "code"):
        assert builtins[name].n_words >= 60_000, name
    assert builtins["news"].n_words >= 59_000  # the whole Lee corpus (59,890 words)
    for name in ("wiki", "news", "science"):
        nw = np.array([n_words(t) for t in builtins[name].texts])
        assert nw.min() >= 40 and nw.max() <= 400, name


def test_builtin_wiki_clean(builtins):
    texts = builtins["wiki"].texts
    assert not any(
        bad in t for t in texts for bad in ("{{", "}}", "[[", "]]", "<ref", "{|", "&nbsp;")
    )
    assert not any(t.lstrip().startswith(("File:", "Image:", "thumb|", "==")) for t in texts)
    assert sum("|" in t for t in texts) <= 0.005 * len(texts)
    assert any("Anarchism is a political philosophy" in t for t in texts)


def test_builtin_domains_and_labels(builtins):
    dom = builtins["domains"]
    counts = dom.label_counts()
    assert set(counts) == {"wiki", "news", "science", "math", "code"}
    assert len(set(counts.values())) == 1
    for i in range(0, len(dom), 97):  # each text really comes from its domain's corpus
        label, rid = dom.ids[i].split("/", 1)
        assert label == dom.labels[i]
        src = builtins[label]
        assert src.texts[src.ids.index(rid)] == dom.texts[i]
    sub = load_texts("builtin:domains", limit=100, seed=1)
    assert sub.label_counts() == dict.fromkeys(sorted(counts), 20)
    assert len(builtins["math"].label_names) == 5
    assert builtins["sentiment"].label_counts() == {"neg": 100, "pos": 100}


def test_list_builtin(builtins):
    rows = {r["name"]: r for r in list_builtin()}
    assert list(rows) == list(BUILTIN_NAMES)
    for name, r in rows.items():
        assert r["fetched"] and r["n_texts"] == len(builtins[name]) and r["licence"]
        assert r["n_words"] == builtins[name].n_words


def test_fetch_is_idempotent_without_network(builtins, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("fetch ran pip although everything is cached")

    monkeypatch.setattr(subprocess, "run", boom)
    manifests = fetch_builtin()
    assert set(manifests) == set(BUILTIN_NAMES)
    man = manifests["wiki"]
    assert man["source"]["wheel"] == B.WHEELS["gensim"].filename
    assert man["source"]["wheel_sha256"] == B.WHEELS["gensim"].sha256
    assert man["n_texts"] == len(builtins["wiki"])
    assert main(["texts", "--fetch"]) == 0


def test_fetch_deterministic_and_rebuilds_stale(private_cache, gensim_wheel):
    first = fetch_builtin(["sentiment"], wheel_dir=gensim_wheel)["sentiment"]
    assert B.is_fetched("sentiment") and not B.is_fetched("news")
    again = fetch_builtin(["sentiment"], wheel_dir=gensim_wheel, force=True)["sentiment"]
    assert again["sha256"] == first["sha256"] and again["n_texts"] == first["n_texts"] == 200
    # a manifest written by another cleaner version makes the corpus stale
    man_path = private_cache / "sentiment.json"
    man = json.loads(man_path.read_text())
    man["builder"] = "something-else"
    man_path.write_text(json.dumps(man))
    assert not B.is_fetched("sentiment")
    assert fetch_builtin(["sentiment"], wheel_dir=gensim_wheel)["sentiment"]["builder"] == B.BUILDER


def test_fetch_rejects_wrong_wheel(private_cache, tmp_path):
    fake = tmp_path / "fakewheels"
    fake.mkdir()
    (fake / B.WHEELS["gensim"].filename).write_bytes(b"not a wheel")
    with pytest.raises(TextsError, match="sha256") as e:
        fetch_builtin(["sentiment"], wheel_dir=fake)
    one_line(e)
    assert not (private_cache / "sentiment.json").exists()


def test_cli_lists_builtin(builtins, capsys):
    assert main(["texts"]) == 0
    out = capsys.readouterr().out
    for name in BUILTIN_NAMES:
        assert f"builtin:{name}" in out
    assert "licence" in out and f"{len(builtins['wiki']):,}" in out


def test_cli_preview_and_error(tmp_path, capsys):
    p = tmp_path / "c.jsonl"
    p.write_text(
        "".join(
            json.dumps({"text": f"text {i} " * 30, "label": "xy"[i % 2]}) + "\n" for i in range(10)
        )
    )
    assert (
        main(["texts", str(p), "--limit", "4", "--seed", "2", "--show", "2", "--width", "40"]) == 0
    )
    out = capsys.readouterr().out
    assert "texts: 4 " in out and "labels: x 2, y 2" in out
    preview = [ln for ln in out.splitlines() if ln.endswith("…")]
    assert len(preview) == 2 and all(len(ln.split(": ", 1)[1]) == 40 for ln in preview)
    assert main(["texts", "builtin:nope"]) == 2
    assert "unknown built-in corpus 'nope'" in capsys.readouterr().err

