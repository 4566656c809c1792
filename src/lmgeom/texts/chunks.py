"""Fixed-length token chunks of a corpus, as dispersion-vs-perplexity, the kNN-LM and the
push-away fine-tuning feed them to a model (METHODS.md, "Dispersion vs perplexity").

1. **Document.** Every text is tokenized without special tokens and the texts are joined, in
   corpus order, with the tokenizer's EOS id (else its SEP id, else nothing) between them.
2. **Chunks.** The document is cut into consecutive chunks of exactly ``chunk_len`` tokens;
   the incomplete tail is dropped. ``max_chunks`` keeps a seeded uniform sample of the chunks
   (``numpy.random.default_rng(seed)``, without replacement, document order kept).
3. **BOS.** With ``bos="auto"`` (default) a BOS token is put in front of each chunk when the
   tokenizer prepends one to ordinary input (Gemma does, SmolLM2 does not), so the model sees
   inputs like the ones it was trained on.

Only the model's tokenizer is used (``model.tokenizer``, ``model.bos_prepended``), so this sits
below the model layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, TextsError
from . import as_textset

DEFAULT_CHUNK_LEN = 512
BOS_CHOICES = ("auto", "on", "off")


@dataclass(frozen=True)
class Chunks:
    """Fixed-length token chunks of one corpus, as fed to the model.

    Attributes:
        tokens: ``(N, chunk_len + bos)`` int64 model inputs (BOS first when ``bos``).
        index: ``(N,)`` position of each chunk among the document's complete chunks.
        start: ``(N,)`` token offset of each chunk in the document.
        n_available: complete chunks in the document (before ``max_chunks``).
        n_document_tokens: tokens in the joined document.
        chunk_len: tokens per chunk (without BOS).
        bos: whether a BOS was prepended.
        separator: token id put between texts (None: none).
    """

    tokens: np.ndarray
    index: np.ndarray
    start: np.ndarray
    n_available: int
    n_document_tokens: int
    chunk_len: int
    bos: bool
    separator: int | None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def resolve_bos(model, bos: str | bool | None) -> bool:
    """``auto`` → whether the tokenizer prepends a BOS; ``on``/``off`` as given."""
    if bos in (None, "auto"):
        return bool(model.bos_prepended)
    if bos in (True, "on"):
        if model.tokenizer.bos_token_id is None:
            raise ConfigError(f"--bos on: the tokenizer of {model.name} has no BOS token")
        return True
    if bos in (False, "off"):
        return False
    raise ConfigError(f"bos must be one of {', '.join(BOS_CHOICES)}, got {bos!r}")


def separator_id(tokenizer) -> int | None:
    """The id joining texts in the document: EOS, else SEP, else None."""
    for name in ("eos_token_id", "sep_token_id"):
        v = getattr(tokenizer, name, None)
        if isinstance(v, int):
            return v
    return None


def document_tokens(model, texts) -> tuple[np.ndarray, int | None]:
    """All texts tokenized without special tokens, joined with the separator: ``(n,)`` ids."""
    tok = model.tokenizer
    enc = tok(list(texts), add_special_tokens=False, truncation=False, verbose=False)["input_ids"]
    sep = separator_id(tok)
    parts: list[np.ndarray] = []
    for i, row in enumerate(enc):
        if i and sep is not None:
            parts.append(np.array([sep], dtype=np.int64))
        parts.append(np.asarray(row, dtype=np.int64))
    doc = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return doc, sep


def make_chunks(
    model,
    texts,
    chunk_len: int = DEFAULT_CHUNK_LEN,
    *,
    max_chunks: int | None = None,
    seed: int = 0,
    bos: str | bool | None = "auto",
) -> Chunks:
    """Cut a corpus into fixed-length token chunks (see the module docstring).

    Args:
        model: anything with a ``tokenizer``, ``bos_prepended`` and ``name`` (a
            :class:`~lmgeom.models.LanguageModel`).
        texts: a :class:`~lmgeom.texts.TextSet`, a list of strings or a text spec.
        chunk_len: tokens per chunk (without BOS).
        max_chunks: keep a seeded uniform sample of at most this many chunks (None: all).
        seed: seed of that sample.
        bos: ``auto`` / ``on`` / ``off`` (:func:`resolve_bos`).

    Returns:
        :class:`Chunks` with ``tokens`` of shape ``(N, chunk_len + bos)``.

    Raises:
        TextsError: the corpus has fewer than ``chunk_len`` tokens.
        ConfigError: ``chunk_len < 2`` or ``max_chunks < 1``.
    """
    if chunk_len < 2:
        raise ConfigError(f"chunk_len must be at least 2 tokens, got {chunk_len}")
    if max_chunks is not None and max_chunks < 1:
        raise ConfigError(f"max_chunks must be >= 1 (or None for all), got {max_chunks}")
    ts = as_textset(texts)
    doc, sep = document_tokens(model, ts.texts)
    n_avail = len(doc) // chunk_len
    if n_avail == 0:
        raise TextsError(
            f"the corpus has {len(doc)} tokens, fewer than one chunk of {chunk_len}; use a "
            "larger corpus or a smaller --chunk-len"
        )
    idx = np.arange(n_avail)
    if max_chunks is not None and n_avail > max_chunks:
        idx = np.sort(np.random.default_rng(seed).choice(n_avail, size=max_chunks, replace=False))
    toks = doc[: n_avail * chunk_len].reshape(n_avail, chunk_len)[idx]
    use_bos = resolve_bos(model, bos)
    if use_bos:
        b = np.full((len(idx), 1), int(model.tokenizer.bos_token_id), dtype=np.int64)
        toks = np.concatenate([b, toks], axis=1)
    return Chunks(tokens=np.ascontiguousarray(toks), index=idx.astype(np.int64),
                  start=(idx * chunk_len).astype(np.int64), n_available=int(n_avail),
                  n_document_tokens=len(doc), chunk_len=int(chunk_len), bos=use_bos,
                  separator=sep)


__all__ = ["BOS_CHOICES", "DEFAULT_CHUNK_LEN", "Chunks", "document_tokens", "make_chunks",
           "resolve_bos", "separator_id"]
