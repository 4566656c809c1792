"""The suite's tokenizer: a byte-level BPE trained once, with Hugging Face ``tokenizers``, on the
suite's training texts and shared by every width.

Like Pythia's (GPT-NeoX) tokenizer: byte-level pre-tokenisation without a prefix space, no BOS
prepended, ``<|endoftext|>`` as BOS / EOS / UNK (it also separates documents in the training
stream) and ``<|padding|>`` as the pad token. Every byte is in the initial alphabet, so any text
encodes without unknown tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from .._io import sha256_bytes
from ..errors import ConfigError

log = logging.getLogger(__name__)

EOS = "<|endoftext|>"
PAD = "<|padding|>"
SPECIAL_TOKENS = (EOS, PAD)
#: 256 byte symbols + the special tokens: the smallest vocabulary a byte-level BPE can have
MIN_VOCAB = 256 + len(SPECIAL_TOKENS)


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    *,
    max_chars: int | None = None,
    model_max_length: int = 2048,
):
    """Train a byte-level BPE tokenizer on ``texts``.

    Training is deterministic for a given sequence of texts (the ``tokenizers`` BPE trainer
    breaks ties between equally frequent pairs by a fixed order).

    Args:
        texts: training texts, in a fixed order.
        vocab_size: target vocabulary size, special tokens included (>= 258).
        max_chars: stop reading texts after this many characters (bounds the training time);
            ``None`` reads everything.
        model_max_length: recorded in the tokenizer (the models' ``max_position_embeddings``).

    Returns:
        A ``transformers.PreTrainedTokenizerFast`` with ``eos/bos/unk = <|endoftext|>`` and
        ``pad = <|padding|>``; ``len(tokenizer) <= vocab_size``.

    Raises:
        ConfigError: ``vocab_size`` below 258, or no text given.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if int(vocab_size) < MIN_VOCAB:
        raise ConfigError(
            f"vocab_size must be at least {MIN_VOCAB} (256 bytes + {len(SPECIAL_TOKENS)} special "
            f"tokens), got {vocab_size}"
        )
    chosen: list[str] = []
    total = 0
    for t in texts:
        if max_chars is not None and total >= max_chars:
            break
        chosen.append(t)
        total += len(t)
    if not chosen:
        raise ConfigError("the tokenizer needs at least one training text")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=int(vocab_size),
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(chosen, trainer, length=len(chosen))
    log.info("trained a byte-level BPE of %d tokens on %d texts (%d chars)",
             tok.get_vocab_size(), len(chosen), total)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS,
        eos_token=EOS,
        unk_token=EOS,
        pad_token=PAD,
        model_max_length=int(model_max_length),
    )


def tokenizer_sha256(tokenizer) -> str:
    """A content hash of the tokenizer (its serialised ``tokenizer.json``)."""
    return sha256_bytes(tokenizer.backend_tokenizer.to_str().encode("utf-8"))


__all__ = ["EOS", "MIN_VOCAB", "PAD", "SPECIAL_TOKENS", "tokenizer_sha256", "train_tokenizer"]
