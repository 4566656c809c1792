"""Shared fixtures: tiny random models of every supported family, built from configs.

Nothing is downloaded: each tiny model gets a small BPE tokenizer trained here on a few
sentences, and is saved as an ordinary Hugging Face folder so tests exercise the real
``load_model`` path.

Tests by kind (``../shared/STYLE.md``): every test is ``unit`` or ``e2e``, decided here at
collection (:func:`pytest_collection_modifyitems`), so a new test lands in the right group
without anyone remembering a marker. ``make test-fast`` runs ``-m "not e2e and not slow"``;
``make test`` runs both. ``pytest -m e2e --co -q`` lists the end-to-end ones.
"""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path

import pytest

os.environ.setdefault("LMGEOM_QUIET", "1")

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Language models map contexts to next-token distributions.",
    "def add(a, b):\n    return a + b",
    "In 1905 Einstein published four papers that changed physics.",
    "Prices rose sharply in the third quarter, analysts said on Monday.",
    "Let x be a real number such that x^2 = 4. Then x = 2 or x = -2.",
] * 4

VOCAB = 256


def _tokenizer(folder: Path, bos: bool = False):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<unk>", "<pad>", "<bos>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    if bos:  # like Gemma / Llama-2: prepend <bos> to every sequence
        tok.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", 2)]
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", bos_token="<bos>", eos_token="<eos>"
    )
    fast.save_pretrained(folder)
    return fast


def tiny_config(family: str):
    import transformers as tf

    common = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 3,
              "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 128}
    if family == "gpt2":
        return tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=3, n_head=4, n_positions=128)
    if family == "gpt_neox":
        return tf.GPTNeoXConfig(**common)
    if family == "gpt_neox_seq":
        return tf.GPTNeoXConfig(**common, use_parallel_residual=False)
    cls = {
        "llama": tf.LlamaConfig, "mistral": tf.MistralConfig, "qwen2": tf.Qwen2Config,
        "qwen3": tf.Qwen3Config, "olmo": tf.OlmoConfig, "olmo2": tf.Olmo2Config,
        "phi3": tf.Phi3Config, "phi": tf.PhiConfig, "gemma": tf.GemmaConfig,
        "gemma2": tf.Gemma2Config, "gemma3_text": tf.Gemma3TextConfig,
    }[family]
    extra = {}
    if family in ("llama", "mistral", "qwen2", "qwen3", "olmo", "olmo2", "gemma", "gemma2", "gemma3_text", "phi3"):
        extra["num_key_value_heads"] = 2
    if family in ("gemma", "gemma2", "gemma3_text", "qwen3"):
        extra["head_dim"] = 8
    return cls(**common, **extra)


FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "olmo", "olmo2", "phi3", "phi", "gemma",
            "gemma2", "gemma3_text", "gpt2", "gpt_neox", "gpt_neox_seq")


def build_tiny(folder: Path, family: str, seed: int = 0) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(family)
    cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id = 1, 2, 3
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # non-trivial norm gains so norm placement matters in tests
        for name, p in model.named_parameters():
            if "norm" in name or "ln" in name:
                p.add_(0.3 * torch.randn_like(p))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    _tokenizer(folder, bos=family.startswith("gemma"))
    return folder


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """``tiny_dir(family)`` → folder of a saved tiny random model (built once per session)."""
    made: dict[str, Path] = {}

    def get(family: str = "llama") -> Path:
        if family not in made:
            made[family] = build_tiny(tmp_path_factory.mktemp(f"tiny-{family}"), family)
        return made[family]

    return get


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Tests get their own activations cache, but share the converted bundled models."""
    real = os.environ.get("LMGEOM_CACHE") or str(Path.home() / ".cache" / "lmgeom")
    tmp = tmp_path_factory.mktemp("lmgeom-cache")
    for sub in ("models", "corpora", "hashes"):
        src = Path(real) / sub
        src.mkdir(parents=True, exist_ok=True)
        (tmp / sub).symlink_to(src, target_is_directory=True)
    os.environ["LMGEOM_CACHE"] = str(tmp)
    state = os.environ.get("LMGEOM_STATE")
    os.environ["LMGEOM_STATE"] = str(tmp_path_factory.mktemp("lmgeom-state"))  # written files
    yield
    os.environ["LMGEOM_CACHE"] = real
    if state is None:
        os.environ.pop("LMGEOM_STATE", None)
    else:
        os.environ["LMGEOM_STATE"] = state


@pytest.fixture(scope="session")
def smollm():
    import lmgeom

    return lmgeom.load_model("smollm2-135m")


# --- tests by kind ----------------------------------------------------------------------------

#: whole modules that are end to end: every test runs real ``lmgeom`` processes, a Ray
#: instance, or a training run
E2E_MODULES = {
    "test_real_model": "loads the bundled smollm2-135m",
    "test_ray": "starts a local Ray instance",
    "test_ray_cluster": "starts a Ray cluster",
    "test_faults": "runs real lmgeom processes (Ctrl-C, full disks, races)",
    "test_reliability": "runs real lmgeom processes (interrupts, concurrent runs)",
}

#: single tests measured over ~2 s on a 2-core machine (``pytest --durations=30``), by
#: ``module::function`` (all parametrisations); a renamed test falls back to the rules below
E2E_TESTS: dict[str, str] = {}

#: source of a test function that makes it end to end
_E2E_SOURCE = re.compile(
    r"\bsubprocess\.|\bPopen\(|sys\.executable|\bray\.init\(|sync_playwright|\bchromium\b")


def _e2e_reason(item: pytest.Item) -> str | None:
    module = item.module.__name__.rsplit(".", 1)[-1] if getattr(item, "module", None) else ""
    name = f"{module}::{getattr(item, 'originalname', item.name)}"
    if module in E2E_MODULES:
        return E2E_MODULES[module]
    if name in E2E_TESTS:
        return E2E_TESTS[name]
    if "smollm" in getattr(item, "fixturenames", ()):
        return "uses the bundled smollm2-135m"
    if item.get_closest_marker("slow") or item.get_closest_marker("browser"):
        return "marked slow or browser"
    fn = getattr(item, "function", None)
    try:
        src = inspect.getsource(fn) if fn is not None else ""
    except (OSError, TypeError):
        src = ""
    if _E2E_SOURCE.search(src):
        return "runs a subprocess, Ray or a browser"
    return None


def pytest_collection_modifyitems(config, items):
    """Mark every test ``e2e`` (real model, real processes, Ray, browser, training, or measured
    slow) or ``unit`` (arrays and tiny random models, in-process)."""
    for item in items:
        reason = _e2e_reason(item)
        if reason is None:
            item.add_marker(pytest.mark.unit)
        else:
            item.add_marker(pytest.mark.e2e(reason=reason))
