"""Hostile corpus inputs (issue 26): every one ends in the exact texts read back, or in a one-line
:class:`TextsError` that names the input. Never a raw UnicodeDecodeError, pandas ParserError,
KeyError, ... and never garbage analysed as if it were text."""

from __future__ import annotations

import json
import logging
import os
import sys

import pandas as pd
import pytest

from lmgeom.cli import main
from lmgeom.errors import LmgeomError, TextsError
from lmgeom.texts import TextSet, load_texts
from lmgeom.texts.reading import decode_text

# mostly ASCII, with a few non-ASCII characters (é, —, a CJK character, an emoji outside the BMP)
TEXTS = ("Café au lait — first text", "second text 中", "third 🙂 text")
LABELS = ("pos", "neg", "pos")


def _one_line_error(exc_info: pytest.ExceptionInfo, *names: object) -> str:
    msg = str(exc_info.value)
    assert isinstance(exc_info.value, LmgeomError)
    assert "\n" not in msg and "\r" not in msg, msg
    for name in names:
        assert str(name) in msg, (name, msg)
    return msg


def _raises(path, *, match: str | None = None, **kw) -> str:
    with pytest.raises(TextsError, match=match) as e:
        load_texts(path, **kw)
    return _one_line_error(e, path)


def _content(fmt: str) -> str:
    if fmt == "txt":
        return "".join(t + "\n" for t in TEXTS)
    if fmt == "jsonl":
        return "".join(
            json.dumps({"text": t, "label": lab}, ensure_ascii=False) + "\n"
            for t, lab in zip(TEXTS, LABELS)
        )
    return "text,label\n" + "".join(f"{t},{lab}\n" for t, lab in zip(TEXTS, LABELS))


# --------------------------------------------------------------------------------------------
# Encodings: UTF-8 with BOM, UTF-16/32 LE/BE with and without BOM, for every text format
# --------------------------------------------------------------------------------------------

ENCODINGS = [
    ("utf-8", True),
    ("utf-16-le", True),
    ("utf-16-le", False),
    ("utf-16-be", True),
    ("utf-16-be", False),
    ("utf-32-le", True),
    ("utf-32-le", False),
    ("utf-32-be", True),
    ("utf-32-be", False),
]


@pytest.mark.parametrize("fmt", ["txt", "jsonl", "csv"])
@pytest.mark.parametrize(("encoding", "bom"), ENCODINGS)
def test_encodings_decoded_exactly(tmp_path, fmt, encoding, bom):
    p = tmp_path / f"c.{fmt}"
    p.write_bytes(("\ufeff" if bom else "").encode(encoding) + _content(fmt).encode(encoding))
    ts = load_texts(p)
    assert ts.texts == TEXTS
    assert ts.labels == (None if fmt == "txt" else LABELS)
    assert ts.ids == ("0", "1", "2") and ts.n_dropped == 0


def test_utf16_crlf_windows_notepad(tmp_path):
    """What Windows Notepad writes as "Unicode": UTF-16-LE, BOM, CRLF."""
    p = tmp_path / "notepad.txt"
    p.write_bytes(b"\xff\xfe" + "one\r\ntwo\r\n".encode("utf-16-le"))
    assert load_texts(p).texts == ("one", "two")


def test_utf16_with_bom_but_broken(tmp_path):
    p = tmp_path / "broken.txt"
    # a lone high surrogate (0xD800) after two good characters
    p.write_bytes(b"\xff\xfe" + "ab".encode("utf-16-le") + b"\x00\xd8" + "cd".encode("utf-16-le"))
    msg = _raises(p, match="UTF-16-LE")
    assert "byte offset 6" in msg and "byte-order mark" in msg and "UTF-8" in msg


def test_utf16_without_bom_odd_length_refused(tmp_path):
    p = tmp_path / "cut.txt"
    p.write_bytes("hello world\n".encode("utf-16-le")[:-1])  # truncated: odd byte count
    msg = _raises(p, match="NUL bytes")
    assert "UTF-16/32" in msg


@pytest.mark.parametrize("ext", ["txt", "jsonl", "csv", "tsv"])
def test_mostly_nul_is_binary(tmp_path, ext):
    p = tmp_path / f"zeros.{ext}"
    p.write_bytes(b"\x00" * 4096 + b"x")
    msg = _raises(p, match="binary file")
    assert "4,096 of 4,097 bytes" in msg and "byte offset 0" in msg


def test_png_given_as_texts(tmp_path):
    p = tmp_path / "image.txt"
    p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    _raises(p, match="NUL bytes")


def test_utf8_with_a_stray_nul(tmp_path):
    p = tmp_path / "nul.jsonl"
    p.write_bytes(b'{"text": "ok"}\n{"text": "b\x00d"}\n')
    msg = _raises(p, match="NUL bytes")
    assert "1 of" in msg and "byte offset 26" in msg


def test_utf8_bom_then_nul(tmp_path):
    p = tmp_path / "bomnul.txt"
    p.write_bytes(b"\xef\xbb\xbfok\n\x00\n")
    _raises(p, match="NUL bytes")


def test_latin1_keeps_utf8_error(tmp_path):
    p = tmp_path / "latin1.csv"
    p.write_bytes("text\ncafé\n".encode("latin-1"))
    msg = _raises(p, match="not valid UTF-8")
    assert "byte 0xe9 at byte offset 8" in msg


def test_decode_text_directly():
    assert decode_text(b"", "x") == "" and decode_text(b"\xef\xbb\xbf", "x") == ""
    assert decode_text("\ufeffhé".encode("utf-16-be"), "x") == "hé"
    with pytest.raises(TextsError, match="in.bin contains NUL"):
        decode_text(b"\x00\x01\x02\x03\x00", "in.bin")


# --------------------------------------------------------------------------------------------
# Empty files
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ext", ["txt", "jsonl", "csv", "tsv", "parquet"])
def test_empty_file(tmp_path, ext):
    p = tmp_path / f"empty.{ext}"
    p.write_bytes(b"")
    _raises(p, match="is empty")


@pytest.mark.parametrize("ext", ["txt", "jsonl", "csv"])
@pytest.mark.parametrize("bom", [b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff\x00\x00"[:2]])
def test_only_bom(tmp_path, ext, bom):
    p = tmp_path / f"bom.{ext}"
    p.write_bytes(bom)
    _raises(p, match="only a byte-order mark")


def test_csv_header_only_and_blank_first_line(tmp_path):
    p = tmp_path / "header.csv"
    p.write_text("text,label\n", encoding="utf-8")
    _raises(p, match="only a header row")
    q = tmp_path / "blankfirst.csv"
    q.write_text("\ntext\nhello\n", encoding="utf-8")
    _raises(q, match="line 1 is blank.*header row")


# --------------------------------------------------------------------------------------------
# CSV / TSV structure
# --------------------------------------------------------------------------------------------


def test_csv_every_row_one_field_more_than_header(tmp_path):
    """The original bug: pandas took the first column as an implicit index, so the texts were
    lost and the labels analysed as texts."""
    p = tmp_path / "shifted.csv"
    p.write_text("text,label\nhello, world,pos\nbye, now,neg\n", encoding="utf-8")
    msg = _raises(p, match="line 2 has 3 fields but the header has 2")
    assert "quote fields" in msg


def test_csv_unquoted_comma_single_column(tmp_path):
    p = tmp_path / "one.csv"
    p.write_text("text\nfine\nhello, world\n", encoding="utf-8")
    _raises(p, match="line 3 has 2 fields but the header has 1")


def test_csv_row_with_fewer_fields(tmp_path):
    p = tmp_path / "short.csv"
    p.write_text("id,text,label\na,one,x\nb,two\n", encoding="utf-8")
    _raises(p, match="line 3 has 2 fields but the header has 3")


def test_csv_ragged_line_number_counts_quoted_newlines(tmp_path):
    p = tmp_path / "multi.csv"
    p.write_text('text,label\n"a\nb\nc",x\nd,e,f\n', encoding="utf-8")
    _raises(p, match="line 5 has 3 fields")


def test_csv_unterminated_quote(tmp_path):
    p = tmp_path / "quote.csv"
    p.write_text('text\nfine\n"starts a quote\nand never ends\n', encoding="utf-8")
    _raises(p, match="line 3 is not valid CSV")


def test_csv_text_after_closing_quote(tmp_path):
    p = tmp_path / "after.csv"
    p.write_text('text\n"quoted"tail\n', encoding="utf-8")
    _raises(p, match="line 2 is not valid CSV")


def test_csv_duplicate_header(tmp_path):
    p = tmp_path / "dup.csv"
    p.write_text("text,text\na,b\n", encoding="utf-8")
    _raises(p, match="names column 'text' twice")


def test_csv_quoting_crlf_and_mixed_line_endings(tmp_path):
    p = tmp_path / "mixed.csv"
    p.write_bytes(
        b'id,text,label\r\n007,"one, with a comma",x\r'
        b'8,"two\r\nlines ""quoted""",y\n'
        b"9,three,x\r\n"
    )
    ts = load_texts(p)
    assert ts.ids == ("007", "8", "9")  # ids are read as written, not as numbers
    assert ts.texts == ("one, with a comma", 'two\nlines "quoted"', "three")
    assert ts.labels == ("x", "y", "x")


def test_csv_blank_lines_are_empty_texts(tmp_path):
    p = tmp_path / "blank.csv"
    p.write_text("text,label\na,x\n\nb,y\n\n", encoding="utf-8")
    ts = load_texts(p)
    assert ts.texts == ("a", "b") and ts.ids == ("0", "2") and ts.n_dropped == 2


def test_tsv_with_quoted_tab(tmp_path):
    p = tmp_path / "c.tsv"
    p.write_text('text\tlabel\n"a\tb"\tx\nc, d\ty\n', encoding="utf-8")
    ts = load_texts(p)
    assert ts.texts == ("a\tb", "c, d") and ts.labels == ("x", "y")


def test_very_long_single_line(tmp_path):
    long = "word " * 60_000 + "end"  # ~300k characters, above csv's default field limit
    (tmp_path / "long.txt").write_text(long + "\n", encoding="utf-8")
    (tmp_path / "long.csv").write_text(f'text\n"{long}"\nshort\n', encoding="utf-8")
    (tmp_path / "long.jsonl").write_text(json.dumps({"text": long}) + "\n", encoding="utf-8")
    assert load_texts(tmp_path / "long.txt").texts == (long,)
    assert load_texts(tmp_path / "long.csv").texts == (long, "short")
    assert load_texts(tmp_path / "long.jsonl").texts == (long,)
    import csv

    assert csv.field_size_limit() == 131072  # restored


def test_text_column_guess_is_announced(tmp_path, caplog):
    p = tmp_path / "guess.csv"
    p.write_text("id,body,score,label\na,hello there,1,x\nb,bye now,2.5,y\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="lmgeom.texts"):
        ts = load_texts(p)
    assert ts.texts == ("hello there", "bye now") and ts.ids == ("a", "b")
    assert ts.labels == ("x", "y")
    msgs = [r.getMessage() for r in caplog.records]
    assert any(str(p) in m and "'body'" in m and "--text-column" in m for m in msgs), msgs
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lmgeom.texts"):
        load_texts(p, text_column="body")
    assert not caplog.records  # chosen explicitly: nothing to announce


# --------------------------------------------------------------------------------------------
# Duplicate and missing ids
# --------------------------------------------------------------------------------------------


def test_duplicate_ids_csv(tmp_path):
    p = tmp_path / "dup.csv"
    p.write_text("id,text\n1,a\n2,b\n1,c\n2,d\n3,e\n", encoding="utf-8")
    msg = _raises(p, match="column 'id' has duplicate ids")
    assert "'1' in line 2, line 4" in msg and "'2' in line 3, line 5" in msg
    assert "drop the duplicate rows" in msg and "rename the 'id' column" in msg


def test_duplicate_ids_jsonl_many(tmp_path):
    p = tmp_path / "dup.jsonl"
    p.write_text(
        "".join(json.dumps({"id": i % 5, "text": f"t{i}"}) + "\n" for i in range(20)),
        encoding="utf-8",
    )
    msg = _raises(p, match="duplicate ids")
    assert "'0' in line 1, line 6, line 11 and 1 more rows" in msg
    assert "and 2 more repeated ids" in msg


def test_duplicate_ids_parquet(tmp_path):
    p = tmp_path / "dup.parquet"
    pd.DataFrame({"id": ["a", "a"], "text": ["x", "y"]}).to_parquet(p)
    msg = _raises(p, match="duplicate ids")
    assert "'a' in row 0, row 1" in msg


def test_duplicate_id_on_a_dropped_empty_row_is_fine(tmp_path):
    p = tmp_path / "ok.csv"
    p.write_text("id,text\n1,kept\n1,\n2,also kept\n", encoding="utf-8")
    ts = load_texts(p)
    assert ts.ids == ("1", "2") and ts.texts == ("kept", "also kept") and ts.n_dropped == 1


def test_missing_id(tmp_path):
    p = tmp_path / "noid.csv"
    p.write_text("id,text\n1,a\n,b\n", encoding="utf-8")
    _raises(p, match="column 'id' is empty in line 3")


def test_textset_duplicate_ids_names_them():
    with pytest.raises(TextsError) as e:
        TextSet(ids=("a", "b", "a", "b", "c"), texts=tuple("vwxyz"), source="mine")
    msg = _one_line_error(e, "mine")
    assert "'a' (2 times)" in msg and "'b' (2 times)" in msg


# --------------------------------------------------------------------------------------------
# JSON Lines
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "kind"),
    [("null", "null"), ("42", "number"), ("[1, 2]", "array"), ("true", "boolean")],
)
def test_jsonl_non_object_line(tmp_path, line, kind):
    p = tmp_path / "c.jsonl"
    p.write_text('{"text": "a"}\n' + line + "\n", encoding="utf-8")
    _raises(p, match=f"line 2 is an? JSON {kind}, not an object")


@pytest.mark.parametrize(
    ("value", "kind"),
    [("5", "number"), ("1.5", "number"), ('["a"]', "array"), ("false", "boolean"),
     ('{"x": 1}', "object")],
)
def test_jsonl_text_not_a_string(tmp_path, value, kind):
    p = tmp_path / "c.jsonl"
    p.write_text('{"text": "fine"}\n{"text": ' + value + "}\n", encoding="utf-8")
    msg = _raises(p, match=f"column 'text' holds an? {kind} in line 2")
    assert "--text-column" in msg


def test_jsonl_null_text_is_dropped(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"text": "a"}\n{"text": null}\n{"text": "c"}\n', encoding="utf-8")
    ts = load_texts(p)
    assert ts.texts == ("a", "c") and ts.ids == ("0", "2") and ts.n_dropped == 1


def test_jsonl_unicode_line_separators_inside_strings(tmp_path):
    texts = ("a\u2028b", "c\u0085d", "e\x0cf", "g\u2029h")
    p = tmp_path / "c.jsonl"
    p.write_text(
        "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts),
        encoding="utf-8",
    )
    assert load_texts(p).texts == texts


def test_jsonl_mixed_line_endings(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_bytes(b'{"text": "a"}\r\n{"text": "b"}\r{"text": "c"}\n{"text": "d"}')
    ts = load_texts(p)
    assert ts.texts == ("a", "b", "c", "d")


def test_jsonl_too_deeply_nested(tmp_path):
    p = tmp_path / "deep.jsonl"
    p.write_text('{"text": ' + "[" * 200_000 + "]" * 200_000 + "}\n", encoding="utf-8")
    _raises(p, match="line 1 nests JSON too deeply")


# --------------------------------------------------------------------------------------------
# Labels
# --------------------------------------------------------------------------------------------


def test_label_nan_in_parquet(tmp_path):
    p = tmp_path / "nan.parquet"
    pd.DataFrame({"text": ["a", "b", "c"], "label": [1.0, float("nan"), 2.0]}).to_parquet(p)
    _raises(p, match="label column 'label' is empty in row 1")
    ok = tmp_path / "ok.parquet"
    pd.DataFrame({"text": ["a", "b"], "label": [1.0, 2.0]}).to_parquet(ok)
    assert load_texts(ok).labels == ("1", "2")


@pytest.mark.parametrize("value", ["NaN", "nan", "", "  "])
def test_label_nan_or_blank_in_csv(tmp_path, value):
    p = tmp_path / "nan.csv"
    p.write_text(f"text,label\na,x\nb,{value}\n", encoding="utf-8")
    _raises(p, match="label column 'label' is empty in line 3")


def test_label_nan_in_jsonl(tmp_path):
    p = tmp_path / "nan.jsonl"
    p.write_text('{"text": "a", "label": "x"}\n{"text": "b", "label": NaN}\n', encoding="utf-8")
    _raises(p, match="label column 'label' is empty in line 2")


def test_label_list_refused(tmp_path):
    p = tmp_path / "lab.jsonl"
    p.write_text('{"text": "a", "label": ["x", "y"]}\n', encoding="utf-8")
    _raises(p, match="label column 'label' holds an array in line 1")


# --------------------------------------------------------------------------------------------
# Paths and file kinds
# --------------------------------------------------------------------------------------------


def test_folder_named_like_a_file(tmp_path):
    d = tmp_path / "corpus.txt"
    d.mkdir()
    _raises(d, match="is a directory")


def test_symlink_loop(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.symlink_to(b)
    b.symlink_to(a)
    _raises(a, match="symbolic link that loops")


def test_broken_symlink(tmp_path):
    a = tmp_path / "a.txt"
    a.symlink_to(tmp_path / "gone.txt")
    msg = _raises(a, match="symbolic link")
    assert "gone.txt" in msg and "does not exist" in msg


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_named_pipe_is_refused_not_read(tmp_path):
    p = tmp_path / "pipe.txt"
    os.mkfifo(p)
    _raises(p, match="not a regular file")  # and returns at once instead of blocking


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True,
                    reason="root reads files whatever their mode")
def test_unreadable_file(tmp_path):
    p = tmp_path / "locked.txt"
    p.write_text("secret\n", encoding="utf-8")
    p.chmod(0)
    try:
        _raises(p, match="cannot be read")
    finally:
        p.chmod(0o644)


def test_unreadable_file_simulated(tmp_path, monkeypatch):
    """Same as above, for runs as root: the read fails with EACCES."""
    import pathlib

    p = tmp_path / "locked.csv"
    p.write_text("text\nx\n", encoding="utf-8")

    def denied(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(pathlib.Path, "read_bytes", denied)
    msg = _raises(p, match="cannot be read: Permission denied")
    assert "permissions" in msg


@pytest.mark.parametrize("name", ["my corpus (v2).txt", "données ünïcode 文本.txt"])
def test_path_with_spaces_and_unicode(tmp_path, name):
    d = tmp_path / "a folder with spaces"
    d.mkdir()
    p = d / name
    p.write_text("one\ntwo\n", encoding="utf-8")
    ts = load_texts(str(p))
    assert ts.texts == ("one", "two") and ts.source == f"file:{p} (lines)"


@pytest.mark.parametrize("name", ["c.json", "c.docx", "c.txt.gz", "noext"])
def test_unknown_extension(tmp_path, name):
    p = tmp_path / name
    p.write_text("hello\n", encoding="utf-8")
    msg = _raises(p, match="unsupported file type")
    assert ".jsonl" in msg and "builtin:NAME" in msg
    if name.endswith(".json"):
        assert "one object per line" in msg


def test_bad_path_strings():
    with pytest.raises(TextsError, match="NUL character") as e:
        load_texts("a\x00b.txt")
    _one_line_error(e)
    with pytest.raises(TextsError, match="no such file") as e:
        load_texts("~no_such_user_lmgeom/x.txt")
    _one_line_error(e, "~no_such_user_lmgeom/x.txt")


@pytest.mark.parametrize("payload", [b"hello", b"PAR1" + b"\x00" * 20 + b"PAR1", b"text\na\n"])
def test_parquet_that_is_not_parquet(tmp_path, payload):
    p = tmp_path / "fake.parquet"
    p.write_bytes(payload)
    _raises(p, match="could not be read as Parquet")


def test_parquet_with_id_as_index(tmp_path):
    p = tmp_path / "indexed.parquet"
    pd.DataFrame({"id": ["x", "y"], "text": ["a", "b"]}).set_index("id").to_parquet(p)
    ts = load_texts(p)
    assert ts.ids == ("x", "y") and ts.texts == ("a", "b")


def test_txt_mixed_line_endings(tmp_path):
    p = tmp_path / "mixed.txt"
    p.write_bytes(b"one\r\ntwo\rthree\nfour")
    assert load_texts(p).texts == ("one", "two", "three", "four")


def test_unknown_builtin_and_hf_without_datasets(monkeypatch):
    with pytest.raises(TextsError, match="unknown built-in corpus 'no_such'") as e:
        load_texts("builtin:no_such")
    _one_line_error(e, "builtin:wiki")
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(TextsError, match="needs the 'datasets' package") as e:
        load_texts("hf:ag_news")
    _one_line_error(e, "hf:ag_news")


# --------------------------------------------------------------------------------------------
# Through the CLI: exit 2, one line on stderr, naming the file
# --------------------------------------------------------------------------------------------


def _cli_error(capsys, argv, name, command="texts") -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"lmgeom {command}: error: "), err
    assert str(name) in lines[0], err
    return lines[0]


@pytest.mark.parametrize(
    ("name", "data", "match"),
    [
        ("shifted.csv", b"text,label\nhello, world,pos\n", "line 2 has 3 fields"),
        ("zeros.txt", b"\x00" * 64, "binary file"),
        ("dup.csv", b"id,text\n7,a\n7,b\n", "duplicate ids: '7'"),
        ("empty.jsonl", b"", "is empty"),
        ("bad.parquet", b"not parquet", "Parquet"),
        ("quote.csv", b'text\n"never closed\n', "line 2 is not valid CSV"),
    ],
)
def test_cli_texts_errors(tmp_path, capsys, name, data, match):
    p = tmp_path / name
    p.write_bytes(data)
    line = _cli_error(capsys, ["texts", str(p)], p)
    assert match in line


def test_cli_texts_folder_and_unknown_extension(tmp_path, capsys):
    _cli_error(capsys, ["texts", str(tmp_path)], tmp_path)
    p = tmp_path / "c.xlsx"
    p.write_bytes(b"PK\x03\x04")
    _cli_error(capsys, ["texts", str(p)], p)


def test_cli_texts_reads_utf16_without_bom(tmp_path, capsys):
    p = tmp_path / "wide.txt"
    p.write_bytes("first line\nsecond line\n".encode("utf-16-le"))
    assert main(["texts", str(p)]) == 0
    out = capsys.readouterr().out
    assert "texts: 2 " in out and "0: first line" in out and "1: second line" in out
    assert "\x00" not in out


def test_cli_extract_refuses_bad_texts_before_the_model(tmp_path, capsys):
    p = tmp_path / "shifted.csv"
    p.write_text("text,label\nhello, world,pos\n", encoding="utf-8")
    out = tmp_path / "out"
    line = _cli_error(
        capsys,
        ["extract", "--texts", str(p), "--model", "no-such-model-lmgeom", "--out", str(out)],
        p,
        command="extract",
    )
    assert "line 2 has 3 fields" in line and not out.exists()


@pytest.mark.parametrize(
    ("name", "data", "match"),
    [
        ("semi.csv", "text;label\nhello;pos\n", "separate fields with ';'"),
        ("tabs.csv", "text\tlabel\nhello\tpos\n", "name it .tsv"),
        ("commas.tsv", "text,label\nhello,pos\n", "name it .csv"),
    ],
)
def test_wrong_separator(tmp_path, name, data, match):
    p = tmp_path / name
    p.write_text(data, encoding="utf-8")
    _raises(p, match=match)
