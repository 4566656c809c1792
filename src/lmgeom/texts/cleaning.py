"""Text cleaning shared by the built-in corpora: wiki markup, sentence splitting, passage packing.

Everything here is a pure function on strings (no I/O), so it is tested directly.

* :func:`clean_wikitext` turns MediaWiki source into plain paragraphs.
* :func:`pack_paragraphs` merges short paragraphs and splits long ones so every passage has
  roughly ``min_words``–``max_words`` whitespace-separated words.
* :func:`detokenize` undoes the " , " / " ." spacing of pre-tokenised corpora.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Sequence

__all__ = [
    "clean_wikitext",
    "detokenize",
    "is_prose",
    "n_words",
    "pack_paragraphs",
    "split_sentences",
]


def n_words(text: str) -> int:
    """Number of whitespace-separated words in ``text``."""
    return len(text.split())


# --------------------------------------------------------------------------------------------
# Sentences and packing
# --------------------------------------------------------------------------------------------

# A sentence ends at . ! ? (optionally followed by a closing quote/bracket) before whitespace and
# an upper-case letter, digit, quote or bracket. Common abbreviations are protected.
_SENT_END = re.compile(r"(?<=[.!?])([\"'\u201d\u2019)\]]?)\s+(?=[\"'\u201c\u2018(\[A-Z0-9])")
_ABBREV = re.compile(
    r"\b(?:e\.g|i\.e|et al|etc|vs|cf|Mr|Mrs|Ms|Dr|Prof|St|Jr|Sr|No|Fig|Eq|Sec|Vol|pp|approx"
    r"|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec|[A-Z])\.$"
)


def split_sentences(text: str) -> list[str]:
    """Split ``text`` into sentences with a conservative punctuation rule.

    Args:
        text: one paragraph.

    Returns:
        The sentences, in order; ``" ".join`` of them equals ``text`` up to whitespace.
    """
    text = " ".join(text.split())
    if not text:
        return []
    out: list[str] = []
    start = 0
    for m in _SENT_END.finditer(text):
        end = m.end(1)
        candidate = text[start:end]
        if _ABBREV.search(candidate):
            continue
        out.append(candidate.strip())
        start = m.end()
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return out


def _split_long(paragraph: str, max_words: int) -> list[str]:
    """Split one paragraph of more than ``max_words`` words into near-equal pieces at sentence
    boundaries (a sentence longer than ``max_words`` is cut between words)."""
    words = n_words(paragraph)
    if words <= max_words:
        return [paragraph]
    k = math.ceil(words / max_words)
    target = math.ceil(words / k)
    units: list[str] = []
    for sent in split_sentences(paragraph):
        toks = sent.split()
        if len(toks) > max_words:
            units.extend(" ".join(toks[i : i + target]) for i in range(0, len(toks), target))
        else:
            units.append(sent)
    pieces: list[str] = []
    cur: list[str] = []
    cur_n = 0
    for unit in units:
        u = n_words(unit)
        if cur and (cur_n + u > max_words or cur_n >= target):
            pieces.append(" ".join(cur))
            cur, cur_n = [], 0
        cur.append(unit)
        cur_n += u
    if cur:
        pieces.append(" ".join(cur))
    return pieces


def pack_paragraphs(
    paragraphs: Iterable[str],
    *,
    min_words: int = 60,
    max_words: int = 400,
    min_keep: int = 40,
    joiner: str = "\n\n",
) -> list[str]:
    """Merge consecutive short paragraphs and split long ones into passages.

    Paragraphs longer than ``max_words`` are split at sentence boundaries into near-equal
    pieces; consecutive pieces are then merged (joined by ``joiner``) until a passage has at
    least ``min_words`` words without exceeding ``max_words``. A short remainder is appended to
    the previous passage when that fits, else kept only if it has ``min_keep`` words.

    Args:
        paragraphs: the paragraphs of one document, in order.
        min_words: a passage is closed once it reaches this many words.
        max_words: no passage is longer than this (unless a single word run is).
        min_keep: passages shorter than this are dropped.
        joiner: separator between merged paragraphs.

    Returns:
        The passages, in document order.
    """
    pieces: list[str] = []
    for p in paragraphs:
        p = p.strip()
        if p:
            pieces.extend(_split_long(p, max_words))
    out: list[str] = []
    out_n: list[int] = []
    cur: list[str] = []
    cur_n = 0
    for piece in pieces:
        w = n_words(piece)
        if cur and cur_n + w > max_words:
            out.append(joiner.join(cur))
            out_n.append(cur_n)
            cur, cur_n = [], 0
        cur.append(piece)
        cur_n += w
        if cur_n >= min_words:
            out.append(joiner.join(cur))
            out_n.append(cur_n)
            cur, cur_n = [], 0
    if cur:
        if out and out_n[-1] + cur_n <= max_words:
            out[-1] = out[-1] + joiner + joiner.join(cur)
            out_n[-1] += cur_n
        else:
            out.append(joiner.join(cur))
            out_n.append(cur_n)
    return [p for p, n in zip(out, out_n) if n >= min_keep]


_ALPHA_WORD = re.compile(r"^[^\W\d_]{2,}[.,;:!?)\"']*$")


def is_prose(text: str, *, min_alpha: float = 0.5) -> bool:
    """True when at least ``min_alpha`` of the words are alphabetic (not numbers, formulas,
    table cells or URLs)."""
    toks = text.split()
    if not toks:
        return False
    return sum(bool(_ALPHA_WORD.match(t)) for t in toks) / len(toks) >= min_alpha


_DETOK_BEFORE = re.compile(r"\s+([,.;:!?%)\]}]|'s\b|n't\b|'re\b|'ve\b|'ll\b|'d\b|'m\b)")
_DETOK_AFTER = re.compile(r"([(\[{$])\s+")


def detokenize(text: str) -> str:
    """Undo tokeniser spacing: ``"it 's good , really ."`` → ``"it's good, really."``."""
    text = " ".join(text.split())
    text = _DETOK_BEFORE.sub(r"\1", text)
    text = _DETOK_AFTER.sub(r"\1", text)
    return text


# --------------------------------------------------------------------------------------------
# MediaWiki markup
# --------------------------------------------------------------------------------------------

#: Section headings whose whole section is reference/navigation boilerplate.
BOILERPLATE_SECTIONS = frozenset(
    s.lower()
    for s in (
        "See also",
        "References",
        "External links",
        "Further reading",
        "Notes",
        "Bibliography",
        "Sources",
        "Footnotes",
        "Citations",
        "Notes and references",
        "References and notes",
        "Works cited",
        "Gallery",
        "Discography",
        "Filmography",
        "Selected works",
        "Selected bibliography",
        "Primary sources",
        "Secondary sources",
        "Cited sources",
        "Links",
        "Related articles",
        "Other",
        "Awards and nominations",
        "Explanatory notes",
    )
)

_DROP_NAMESPACES = ("file", "image", "category", "media")
_LANG_PREFIX = re.compile(r"^[a-z]{2,3}(?:-[a-z]+)*$|^simple$")
# Elements removed with their content (``math`` keeps a short plain formula, see _element).
_DROP_ELEMENTS = (
    "ref",
    "math",
    "gallery",
    "timeline",
    "imagemap",
    "score",
    "syntaxhighlight",
    "source",
    "chem",
    "ce",
    "graph",
    "mapframe",
    "templatedata",
    "references",
    "hiero",
    "table",
)
_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.DOTALL)
_SELF_CLOSING = re.compile(r"<\s*(?:ref|references)\b[^>]*/\s*>", re.IGNORECASE)
_ELEMENT = re.compile(
    r"<\s*(" + "|".join(_DROP_ELEMENTS) + r")\b[^>]*>(.*?)(?:<\s*/\s*\1\s*>|\Z)",
    re.IGNORECASE | re.DOTALL,
)
_SIMPLE_FORMULA = re.compile(r"^[\w\s+\-*/=<>().,^'′]{1,40}$")
_BR = re.compile(r"<\s*br\s*/?\s*>|<\s*hr\s*/?\s*>", re.IGNORECASE)
_TAG = re.compile(r"</?\s*[a-zA-Z][a-zA-Z0-9]*\b[^<>]*?/?>")
_EXT_LINK = re.compile(r"\[(?:https?:|ftp:)?//[^\s\]]+(?:\s+([^\]]*))?\]")
_BARE_URL = re.compile(r"\b(?:https?|ftp)://\S+")
_BOLD_ITALIC = re.compile(r"'{2,}")
_MAGIC = re.compile(r"__[A-Z]+__")
_HEADING = re.compile(r"^(={1,6})\s*(.*?)\s*\1\s*$")
_TEMPLATE_TOKEN = re.compile(r"\{\{|\}\}")
_LINK_TOKEN = re.compile(r"\[\[|\]\]")


def _element(m: re.Match[str]) -> str:
    """A removed element; ``<math>x = y</math>`` keeps a short formula without LaTeX."""
    if m.group(1).lower() == "math":
        formula = " ".join(m.group(2).split())
        if _SIMPLE_FORMULA.match(formula):
            return formula
    return ""


def _resolve_nested(text: str, token: re.Pattern[str], opener: str, render) -> str:
    """Replace every balanced ``opener ... closer`` construct, innermost first, by
    ``render(inner)`` (``inner`` has its own nested constructs already rendered). Stray
    closers are kept; an unclosed opener is dropped with the rest of its paragraph."""
    buf: list[str] = []
    stack: list[int] = []
    pos = 0
    for m in token.finditer(text):
        buf.append(text[pos : m.start()])
        pos = m.end()
        if m.group() == opener:
            stack.append(len(buf))
            buf.append(opener)
        elif stack:
            i = stack.pop()
            inner = "".join(buf[i + 1 :])
            del buf[i:]
            buf.append(render(inner))
        else:
            buf.append(m.group())
    buf.append(text[pos:])
    if stack:  # unclosed: cut from the outermost unclosed opener to the next blank line
        i = stack[0]
        rest = "".join(buf[i + 1 :])
        blank = rest.find("\n\n")
        buf[i:] = [rest[blank:] if blank >= 0 else ""]
    return "".join(buf)


def _template_args(inner: str) -> tuple[str, list[str], dict[str, str]]:
    parts = [p.strip() for p in inner.split("|")]
    name = parts[0].lower().replace("_", " ").strip()
    positional: list[str] = []
    named: dict[str, str] = {}
    for p in parts[1:]:
        key, eq, value = p.partition("=")
        if eq and re.fullmatch(r"[\w\- ]+", key.strip()):
            named[key.strip().lower()] = value.strip()
        else:
            positional.append(p)
    return name, positional, named


_RANGE_WORDS = {"to", "-", "–", "and", "by", "x", "×", "or", "+/-", "±"}
_SPECIAL_TEMPLATES = {
    "'s": "'s",
    "nbsp": " ",
    "·": " · ",
    "•": " • ",
    "ndash": "–",
    "mdash": "—",
    "snd": " – ",
    "spaced ndash": " – ",
    "okina": "ʻ",
    "circa": "c.",
    "c.": "c.",
    "=": "=",
    "dash": "–",
}


def _render_template(inner: str) -> str:
    """Plain text for the few inline templates that carry words (convert, lang, nowrap, ...);
    every other template (citations, infoboxes, navboxes, maintenance tags) → ``""``."""
    name, pos, named = _template_args(inner)
    if name in _SPECIAL_TEMPLATES:
        return _SPECIAL_TEMPLATES[name]
    if not pos and name not in ("quote", "blockquote", "quotation"):
        return ""
    if name in ("convert", "cvt"):
        if len(pos) >= 4 and pos[1].lower() in _RANGE_WORDS:
            return f"{pos[0]} {pos[1]} {pos[2]} {pos[3]}"
        return f"{pos[0]} {pos[1]}" if len(pos) >= 2 else pos[0]
    if name in ("lang", "transl") or name.startswith("lang-"):
        return pos[-1]
    if name in (
        "nowrap",
        "nobr",
        "small",
        "smaller",
        "big",
        "nihongo",
        "val",
        "nts",
        "abbr",
        "vanchor",
        "keypress",
        "angbr",
        "sub",
        "sup",
        "em",
        "strong",
        "visible anchor",
        "not a typo",
        "sic",
        "lang2",
        "unicode",
        "script",
        "ill",
        "interlanguage link",
        "math",
        "mvar",
        "var",
        "nowiki",
        "text",
        "chem name",
        "gaps",
        "ipa",
    ):
        return pos[0] if name != "angbr" else f"⟨{pos[0]}⟩"
    if name == "respell":
        return "-".join(pos)
    if name == "as of":
        return "As of " + " ".join(pos[:1])
    if name == "frac":
        return "/".join(pos[:2]) if len(pos) >= 2 else f"1/{pos[0]}"
    if name in ("quote", "blockquote", "quotation"):
        return named.get("text") or named.get("quote") or (pos[0] if pos else "")
    if name in ("hlist", "flatlist", "plainlist"):
        return ", ".join(pos)
    return ""


def _strip_templates(text: str) -> str:
    """Remove ``{{...}}`` templates (nested), rendering the few inline ones that carry text."""
    return _resolve_nested(text, _TEMPLATE_TOKEN, "{{", _render_template)


def _strip_tables(text: str) -> str:
    """Remove ``{| ... |}`` tables (nested); table syntax opens and closes at line starts."""
    out: list[str] = []
    depth = 0
    for line in text.split("\n"):
        s = line.lstrip(" :")
        if s.startswith("{|"):
            depth += 1
            continue
        if depth > 0:
            if s.startswith("|}"):
                depth -= 1
            continue
        out.append(line)
    return "\n".join(out)


def _render_link(inner: str) -> str:
    target, _, label = inner.partition("|")
    target = target.strip()
    colon_start = target.startswith(":")
    prefix, sep, _rest = target.lstrip(":").partition(":")
    prefix_l = prefix.strip().lower()
    if sep and not colon_start and prefix_l in _DROP_NAMESPACES:
        return ""
    if sep and not colon_start and not label and _LANG_PREFIX.match(prefix_l):
        return ""  # interlanguage link
    if label.strip():
        return label.rsplit("|", 1)[-1].strip()
    if label == "" and inner.endswith("|"):  # pipe trick: [[Foo (bar)|]] -> Foo
        return re.sub(r"\s*\(.*?\)\s*$", "", target.lstrip(":")).split(":")[-1]
    text = target.lstrip(":")
    return text.removeprefix("#")


def _strip_links(text: str) -> str:
    """Replace ``[[a|b]]`` by ``b`` and ``[[a]]`` by ``a``; drop file/category/interlanguage
    links with their (possibly multi-line, nested) captions."""
    return _resolve_nested(text, _LINK_TOKEN, "[[", _render_link)


_SPACE_BEFORE_PUNCT = re.compile(r"[ \t]+([,.;:!?)\]])")
_SPACE_AFTER_OPEN = re.compile(r"([(\[])[ \t]+")
_EMPTY_PARENS = re.compile(r"\(\s*(?:[,;:.\-\u2013\u2014]\s*)*\)")
_LEADING_PUNCT_IN_PARENS = re.compile(r"\(\s*[,;:]\s*")
_TRAILING_PUNCT_IN_PARENS = re.compile(r"\s*[,;:]\s*\)")
_DOUBLE_PUNCT = re.compile(r"([,;])\s*(?=[,;.])")
_MULTISPACE = re.compile(r"[ \t\u00a0\u2009\u200a\u2002\u2003\u202f]+")


def _tidy(line: str) -> str:
    line = _MULTISPACE.sub(" ", line)
    for _ in range(2):
        line = _EMPTY_PARENS.sub("", line)
        line = _LEADING_PUNCT_IN_PARENS.sub("(", line)
        line = _TRAILING_PUNCT_IN_PARENS.sub(")", line)
        line = _DOUBLE_PUNCT.sub("", line)
        line = _SPACE_BEFORE_PUNCT.sub(r"\1", line)
        line = _SPACE_AFTER_OPEN.sub(r"\1", line)
        line = _MULTISPACE.sub(" ", line)
    line = line.strip()
    return line.lstrip(",;: ").strip()


def _inline(text: str) -> str:
    """Inline markup of one line (links and templates already resolved) → plain text."""
    text = _EXT_LINK.sub(lambda m: m.group(1) or "", text)
    text = _BARE_URL.sub("", text)
    text = _BOLD_ITALIC.sub("", text)
    text = _TAG.sub("", text)
    text = html.unescape(text)
    text = text.replace("[[", "").replace("]]", "").replace("{{", "").replace("}}", "")
    return _tidy(text)


def clean_wikitext(
    wikitext: str,
    *,
    min_list_words: int = 10,
    drop_sections: frozenset[str] = BOILERPLATE_SECTIONS,
) -> list[str]:
    """Convert MediaWiki source to plain-text paragraphs.

    Removes comments, ``<ref>`` footnotes, templates ``{{..}}`` (infoboxes, citations,
    navboxes), tables ``{|..|}``, ``<math>``/``<gallery>``-like elements, file/category/
    interlanguage links, HTML tags and entities, bold/italic quotes and magic words; replaces
    ``[[target|label]]`` by ``label`` and ``[text url]`` by ``text``; drops headings and whole
    boilerplate sections (References, See also, External links, ...). List items are kept (as
    their own paragraphs, markers removed) only when they have at least ``min_list_words``
    words, which keeps sentence-like items and drops link lists.

    Args:
        wikitext: raw article source (XML-unescaped).
        min_list_words: shortest list item kept.
        drop_sections: lower-cased headings whose sections are dropped.

    Returns:
        Paragraphs of plain text, in article order (each a single line).
    """
    text = wikitext.replace("\r\n", "\n")
    text = _COMMENT.sub("", text)
    text = _SELF_CLOSING.sub("", text)
    text = _ELEMENT.sub(_element, text)
    text = _strip_templates(text)
    text = _strip_tables(text)
    text = _strip_links(text)
    text = _BR.sub(" ", text)
    text = _MAGIC.sub("", text)

    paragraphs: list[str] = []
    cur: list[str] = []
    skip_level = 0  # > 0 while inside a dropped section of that heading level

    def flush() -> None:
        if cur:
            para = _tidy(" ".join(cur))
            if para:
                paragraphs.append(para)
            cur.clear()

    for raw in text.split("\n"):
        line = raw.rstrip()
        h = _HEADING.match(line.strip())
        if h:
            flush()
            level = len(h.group(1))
            title = _inline(h.group(2)).lower().strip(" :")
            if skip_level and level > skip_level:
                continue
            skip_level = level if title in drop_sections else 0
            continue
        if skip_level:
            continue
        stripped = line.strip()
        if not stripped:
            flush()
            continue
        if stripped[0] in "*#;:":
            flush()
            item = _inline(stripped.lstrip("*#;: "))
            if n_words(item) >= min_list_words:
                paragraphs.append(item)
            continue
        if stripped[0] in "|!" or stripped.startswith(("{|", "----")):
            flush()
            continue
        if line.startswith(" "):  # preformatted block
            flush()
            continue
        cur.append(_inline(stripped))
    flush()
    return [p for p in paragraphs if n_words(p) >= 3]


def strip_markup_residue_check(texts: Sequence[str]) -> list[int]:
    """Indices of texts that still contain wiki markup (``{{``, ``}}``, ``[[``, ``]]``,
    ``<ref``, ``{|``). Used by the corpus builder and the tests."""
    bad = ("{{", "}}", "[[", "]]", "<ref", "{|", "|}", "&nbsp;")
    return [i for i, t in enumerate(texts) if any(b in t for b in bad)]
