"""Option groups shared by experiments (tuned-lens style): plain frozen dataclasses that carry
their own behaviour (``ModelOptions.load``, ``TextOptions.load``), so the CLI, the Python API
and a Ray worker build models and text sets the same way.

They are also the CLI's option groups: each field's ``Attributes:`` entry is its ``--help``
and its ``metadata["cli"]`` what else the command line needs
(``lmgeom.commands.options.add_options``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
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
    """

    spec: str = field(default=DEFAULT_TEXTS, metadata={"cli": {"flag": "--texts",
                                                                "metavar": "SPEC"}})
    n: int | None = field(default=512, metadata={"cli": {"type": "positive_int"}})
    seed: int = field(default=0, metadata={"cli": {"cli": False}})  # the run's --seed
    split: str | None = None
    text_column: str | None = None
    label_column: str | None = None

    def load(self, spec: str | None = None):
        from ..texts import load_texts  # numpy: kept off ``lmgeom --help``

        return load_texts(spec or self.spec, limit=self.n, seed=self.seed, split=self.split,
                          text_column=self.text_column, label_column=self.label_column)


__all__ = ["DEFAULT_TEXTS", "ModelOptions", "TextOptions"]
