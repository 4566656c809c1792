"""Shared fixtures: tiny random models of every supported family, built from configs.

Nothing is downloaded: each tiny model gets a small BPE tokenizer trained here on a few
sentences, and is saved as an ordinary Hugging Face folder so tests exercise the real
``load_model`` path.

Tests by kind: the folder is the kind. ``tests/unit`` holds tests on arrays and tiny random
models, in-process, each well under a second (``make test-fast``, the inner loop);
``tests/e2e`` the real bundled models, real ``lmgeom`` processes (faults, races, Ctrl-C), Ray,
training and anything measured over 1 s; ``tests/docs`` the site build and the browser; the
code blocks of README.md and docs/ are ``docs`` too. Helpers and fixtures that a unit file and
its ``_e2e`` twin share live in ``tests/support/``. :func:`pytest_collection_modifyitems` marks
each test with its kind, so ``pytest -m e2e`` still selects by kind.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("LMGEOM_QUIET", "1")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # n workers share the cores: each torch / BLAS pool (and every lmgeom process a test starts,
    # which inherits the environment) gets its share, or the pools oversubscribe the machine.
    # Set before torch is imported, which reads them once.
    _share = max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, str(_share))

#: the real headless Chromium the browser tests drive (Debian package; ``make browser``)
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
CHROME_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-quic", "--no-first-run", "--disable-sync"]

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Language models map contexts to next-token distributions.",
    "def add(a, b):\n    return a + b",
    "In 1905 Einstein published four papers that changed physics.",
    "Prices rose sharply in the third quarter, analysts said on Monday.",
    "Let x be a real number such that x^2 = 4. Then x = 2 or x = -2.",
] * 4

VOCAB = 256


def paused_at(folder: Path, stage: str, n: int = 1) -> dict[str, str]:
    """Environment that stops an lmgeom process at the ``n``-th ``pause(stage)`` point until
    :func:`release` (the deterministic hook of :mod:`lmgeom._testing`)."""
    folder.mkdir(parents=True, exist_ok=True)
    # the hold outlasts wait_paused's guard, so a slow machine never sees the pause time out
    return {"LMGEOM_PAUSE_AT": f"{stage}:{n}", "LMGEOM_PAUSE_DIR": str(folder),
            "LMGEOM_TEST_HOLD_S": "900"}


def wait_paused(proc, folder: Path, stage: str, guard_s: float = 600) -> None:
    """Block until ``proc`` has reached its pause point in ``stage`` (it wrote
    ``<stage>.paused``). The deadline only guards against a hang; the wait itself is for an
    event, so the test does not depend on how fast the machine is."""
    import time

    marker = folder / f"{stage}.paused"
    deadline = time.monotonic() + guard_s
    while not marker.is_file():
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else b""
            err = err.decode() if isinstance(err, bytes) else err
            raise AssertionError(f"the run ended (rc={proc.returncode}) before its pause point "
                                 f"in {stage}: {err[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no pause point in {stage} after {guard_s:.0f} s")
        time.sleep(0.02)
    assert int(marker.read_text()) == proc.pid


def sigint_default() -> None:
    """``preexec_fn`` of a child that a test stops with SIGINT (Ctrl-C). A suite run as a
    background job (``make test &``, nohup, some CI runners) starts its children with SIGINT
    ignored, and Python then keeps it ignored: the child would never hear the signal."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def release(folder: Path, stage: str) -> None:
    (folder / f"{stage}.release").write_text("go\n")


def assert_same_table(a: Path, b: Path) -> None:
    """Two ``layers.csv`` (or ``layers.parquet``) written by two processes hold the same numbers: every row byte for
    byte, except the logit-lens rows, whose values agree to 1e-3 relative. The logit-lens KL
    is a float32 difference of log-probabilities; across processes one layer's KL was seen to
    move by 1e-5..7e-5 relative (3 times in 53 loop passes of the fault tests, cause not found:
    the states were bit-identical, and neither thread count nor memory alignment changes it),
    while every PGA, PC1 and spectral row matched exactly."""
    import numpy as np

    if Path(a).suffix == ".parquet":  # the same rule on the parquet tables
        import pandas as pd

        fa, fb = pd.read_parquet(a), pd.read_parquet(b)
        lens_a, lens_b = fa.metric.str.startswith("logit_lens"), fb.metric.str.startswith("logit_lens")
        assert lens_a.tolist() == lens_b.tolist()
        pd.testing.assert_frame_equal(fa[~lens_a], fb[~lens_b], check_exact=True)
        pd.testing.assert_frame_equal(fa[lens_a], fb[lens_b], check_exact=False, rtol=1e-3)
        return
    la, lb = a.read_text().splitlines(), b.read_text().splitlines()
    assert len(la) == len(lb), (len(la), len(lb))
    for x, y in zip(la, lb):
        if x == y:
            continue
        fx, fy = x.split(","), y.split(",")
        assert fx[5].startswith("logit_lens") and fx[:7] == fy[:7] and fx[10:] == fy[10:], (x, y)
        np.testing.assert_allclose([float(v) for v in fx[7:10] if v],
                                   [float(v) for v in fy[7:10] if v], rtol=1e-3)


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

#: the kind of a test is the folder it lives in (``tests/unit``, ``tests/e2e``, ``tests/docs``);
#: a code block of README.md or docs/ is ``docs`` too. No list of names to keep in step.
KINDS = ("unit", "e2e", "docs")


def kind_of(path: Path) -> str:
    """``unit``, ``e2e`` or ``docs``: the folder under ``tests/`` (a ``.md`` page is ``docs``)."""
    path = Path(path)
    if path.suffix == ".md":
        return "docs"
    here = Path(__file__).resolve().parent
    try:
        folder = path.resolve().relative_to(here).parts[0]
    except ValueError:
        return "docs"  # a page outside tests/ (README.md, docs/*.md) collected by Sybil
    if folder not in KINDS:
        raise pytest.UsageError(f"{path}: a test lives in tests/unit, tests/e2e or tests/docs")
    return folder


def pytest_collection_modifyitems(config, items):
    """Mark every test by its folder: ``unit`` (arrays and tiny random models, in-process, fast),
    ``e2e`` (real bundled models, real processes, Ray, training, or measured over 1 s) or
    ``docs`` (the site build, the browser, the documentation's code blocks; also ``e2e``)."""
    for item in items:
        kind = kind_of(item.path)
        item.add_marker(getattr(pytest.mark, kind))
        if kind == "docs":
            item.add_marker(pytest.mark.e2e)
