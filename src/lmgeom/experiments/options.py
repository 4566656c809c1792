"""Option groups shared by experiments (tuned-lens style): plain frozen dataclasses that carry
their own behaviour (``ModelOptions.load``, ``TextOptions.load``), so the CLI, the Python API
and a Ray worker build models and text sets the same way.

They are also the CLI's option groups: each field's ``Attributes:`` entry is its ``--help``
and its ``metadata["cli"]`` what else the command line needs
(``lmgeom.commands.options.add_options``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

DEFAULT_TEXTS = "builtin:domains"


@dataclass(frozen=True)
class ModelOptions:
    """How a model is loaded (:func:`lmgeom.load_model` keywords).

    Attributes:
        revision: hub revision / branch (e.g. Pythia's ``step1000``).
        dtype: dtype of the forward pass (see docs/dtype.md for the evidence behind the default).
        device: cpu, cuda, cuda:1, mps (default: cuda if available).
        device_map: transformers ``device_map``, e.g. auto (big models).
        trust_remote_code: allow code shipped with a hub model to run (off by default).
    """

    revision: str | None = None
    dtype: str = field(default="float32",
                       metadata={"cli": {"choices": ("float32", "bfloat16", "float16")}})
    device: str | None = None
    device_map: str | None = None
    trust_remote_code: bool = False

    def load_kwargs(self) -> dict[str, Any]:
        return asdict(self)

    def load(self, spec: str, **override: Any):
        from ..models import load_model

        return load_model(spec, **{**self.load_kwargs(), **override})


@dataclass(frozen=True)
class TextOptions:
    """Which texts (:func:`lmgeom.load_texts`): a spec, a seeded label-balanced sample of ``n``.

    Attributes:
        spec: builtin:NAME (see `lmgeom texts`), a .txt/.jsonl/.csv/.parquet file, or
            hf:NAME[:CONFIG][:SPLIT].
        n: number of texts (a seeded, label-balanced sample; none: all).
        seed: seed of the sample.
        split: for .txt: 'paragraphs' splits on blank lines.
        text_column: text column of a jsonl/csv/parquet file.
        label_column: label column of a jsonl/csv/parquet file.
        within: draw the ``n`` texts as the nested seeded subset
            (:func:`~lmgeom.texts.nested_sample_indices`) of the seeded sample of ``within``
            texts, so that every n up to ``within`` shares its texts with the smaller n of an
            n-ladder (``claims`` sets it to the reference n, 256: ``claims --n 64`` decides on
            the texts of the n = 64 rung of ``--n-ladder 64,128,256``). ``None``: a plain
            seeded sample of ``n``.
    """

    spec: str = field(default=DEFAULT_TEXTS, metadata={"cli": {"flag": "--texts",
                                                                "metavar": "SPEC"}})
    n: int | None = field(default=512, metadata={"cli": {"type": "positive_int"}})
    seed: int = field(default=0, metadata={"cli": {"cli": False}})  # the run's --seed
    split: str | None = None
    text_column: str | None = None
    label_column: str | None = None
    within: int | None = field(default=None, metadata={"cli": {"cli": False}})

    def _nested(self) -> bool:
        return self.within is not None and self.n is not None and self.n < self.within

    def load(self, spec: str | None = None):
        from ..texts import load_texts  # numpy: kept off ``lmgeom --help``

        ts = load_texts(spec or self.spec, limit=self.within if self._nested() else self.n,
                        seed=self.seed, split=self.split, text_column=self.text_column,
                        label_column=self.label_column)
        if not self._nested() or self.n >= len(ts):
            return ts
        return self._nested_subset(ts, self.n)

    def _nested_subset(self, reference, n: int):
        from ..texts import nested_sample_indices

        idx = nested_sample_indices(len(reference), [n], labels=reference.labels,
                                    seed=self.seed)[n]
        return replace(reference.subset(idx),
                       source=f"{reference.source} [nested {n}, seed {self.seed}]")

    def nested_picks(self, texts, sizes, *, seed: int | None = None) -> dict[int, Any]:
        """Positions in ``texts`` (what ``load()`` returned) of each smaller n of a ladder:
        nested seeded subsets, the smaller inside the larger. With ``within`` they are the
        nested subsets of the reference sample of ``within`` texts, i.e. the very texts a run
        with ``n`` = that size loads (``load()``), so an n decides alike as a rung or on its
        own; without, nested subsets of ``texts`` (``seed``: default this one's)."""
        import numpy as np

        from ..texts import load_texts, nested_sample_indices

        sizes = sorted({int(m) for m in sizes if int(m) < len(texts)})
        if not sizes:
            return {}
        if self.within is not None and self.n is not None:
            ref = load_texts(self.spec, limit=self.within, seed=self.seed, split=self.split,
                             text_column=self.text_column, label_column=self.label_column)
            where = {t: i for i, t in enumerate(ref.ids)}
            mine = np.array([where.get(t, -1) for t in texts.ids], dtype=np.int64)
            nested = nested_sample_indices(len(ref), [*sizes, len(texts)], labels=ref.labels,
                                           seed=self.seed)
            top = nested[len(texts)]
            if len(where) == len(ref) and np.array_equal(mine, top):
                return {m: np.searchsorted(mine, nested[m]) for m in sizes}
        seed = self.seed if seed is None else seed
        return nested_sample_indices(len(texts), sizes, labels=getattr(texts, "labels", None),
                                     seed=seed)


__all__ = ["DEFAULT_TEXTS", "ModelOptions", "TextOptions"]
