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
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("LMGEOM_QUIET", "1")

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

#: whole modules that are end to end: real ``lmgeom`` processes, Ray, the bundled model, or a
#: forward pass per architecture in every test
E2E_MODULES = {
    "test_real_model": "loads the bundled smollm2-135m",
    "test_claims_e2e": "runs lmgeom claims on the bundled models",
    "test_claims_dispersion_e2e": "runs the dispersion claims D1-D8 on smollm2-135m",
    "test_bundled_qwen": "loads the bundled qwen2.5-coder-0.5b (first load converts it, ~60 s)",
    "test_train_geometry": "trains micro suites and a tiny fine-tune with the geometry monitor",
    "test_ray": "starts a local Ray instance",
    "test_ray_cluster": "starts a Ray cluster",
    "test_faults": "runs real lmgeom processes (Ctrl-C, full disks, races)",
    "test_reliability": "runs real lmgeom processes (interrupts, concurrent runs)",
    "test_padding": "every architecture x padding side, real forward passes (~4 min)",
    "test_peers": "agreement with transformers and reptrix on every family (~3 min)",
}

#: tests measured over 1 s on a shared 2-core machine (any parametrisation; whole runs of the
#: CLI, reports, training, every-family forward checks), by module and function name. A new slow
#: test: add it here (``pytest -m unit --durations=20`` finds it); a renamed one falls back to
#: the rules below.
E2E_TESTS: dict[str, tuple[str, ...]] = {
    "test_bad_input": ("test_empty_corpus", "test_out_of_disk_while_writing_the_cache",
        "test_output_folder_of_a_different_run", "test_single_class_probe",
        "test_truncation_is_reported",),
    "test_cli": ("test_converge_cli_on_two_tiny_architectures",),
    "test_dispersion_experiments": ("test_attach_adds_a_dispersion_section_to_an_analyze_run",
        "test_cli_dispersion_end_to_end", "test_cli_hardness_and_clusters",
        "test_cluster_dispersion_matches_explicit_states",
        "test_measure_chunks_matches_transformers",),
    "test_extract": ("test_mean_pooling_definition",
        "test_tokens_pooling_is_a_seeded_sample_without_position_0",),
    "test_hostile_inputs": ("test_edited_corpus_recomputes",
        "test_overwrite_removes_only_the_runs_own_files",
        "test_rerun_refuses_before_work_when_the_table_was_edited_by_hand",
        "test_weights_replaced_in_place_recompute",),
    "test_hostile_stats": ("test_analyze_with_few_texts_skips_probes_and_keeps_the_run",
        "test_cli_few_null_draws_warned_and_flagged", "test_few_null_draws_warn_and_flag",),
    "test_knnlm": ("test_cli_knnlm_select_end_to_end",
        "test_lambda_zero_equals_the_base_perplexity_exactly",
        "test_pipeline_matches_brute_force_on_a_tiny_model",),
    "test_losses": ("test_trainer_integration_runs_and_adds_the_term",),
    "test_metrics_pga_batched": ("test_float32_levels_within_documented_tolerance",),
    "test_metrics_properties": ("test_pga_invariant_to_scale_and_rotation",),
    "test_monitor": ("test_rows_are_the_sweep_table_and_its_figures_read_them",
        "test_trainer_run_logs_to_tensorboard_and_writes_the_parquet",
        "test_training_is_bit_identical_with_and_without_the_monitor",),
    "test_models_arch": ("test_padding_never_leaks", "test_residual_points_match_hidden_states",
        "test_sublayer_points_sum_to_block_update",),
    "test_per_item": ("test_analyze_log_samples_one_row_per_text",
        "test_analyze_token_pooling_probes_use_each_rows_text_label",
        "test_hardness_and_dispersion_log_samples", "test_model_args_reach_the_loader",
        "test_per_token_nll_streams_and_sums_to_the_text_nll",),
    "test_perplexity": ("test_cli_ppl_writes_table", "test_forward_cache_resumes_after_a_crash",
        "test_forward_chunks_reducers_match_hidden_states", "test_matches_transformers_loss",
        "test_nll_sum_matches_explicit_log_softmax",
        "test_padding_and_chunking_do_not_change_values", "test_sliding_window_matches_hf_recipe",),
    "test_regularisers": ("test_training_steps_on_a_tiny_model_move_dispersion",),
    "test_report": ("test_bad_inputs_raise_typed_errors", "test_dollar_signs_do_not_break_plots",
        "test_layer_axis_order_and_ticks", "test_null_band_and_ci_bands",
        "test_panels_per_model_and_log_scale", "test_plots_written_as_valid_png_and_svg",
        "test_sections_only_when_metrics_exist", "test_two_models_share_tables",
        "test_unknown_metrics_and_csv_round_trip", "test_write_report_structure",),
    "test_select": ("test_agreement_within_each_suite_width", "test_cli_select_across_families",
        "test_cli_select_suite_known_gap_order",),
    "test_suite": ("test_make_hooks_see_every_step_of_every_width",
        "test_micro_suite_saves_loadable_checkpoints",
        "test_resume_after_interruption_is_bit_identical",),
    "test_sweep": ("test_identical_weights_warned_in_sweep", "test_sweep_rerun_reuses_jobs",
        "test_sweep_rows_per_width_and_step",),
    "test_texts": ("test_autofetch_on_load_and_repair", "test_builtin_code_parses",
        "test_fetch_download_failure",),
    "test_train": ("test_full_finetune_end_to_end", "test_lora_compare_cross_domain",
        "test_registered_experiment_matches_the_cli_and_runs_hooks",
        "test_resume_continues_exactly",),
}

#: source of a test function that makes it end to end
_E2E_SOURCE = re.compile(
    r"\bsubprocess\.|\bPopen\(|sys\.executable|\bray\.init\(|sync_playwright|\bchromium\b")


def _e2e_reason(item: pytest.Item) -> str | None:
    if str(getattr(item, "path", "")).endswith(".md"):
        return "a code block of the documentation (README.md, docs/)"
    module = item.module.__name__.rsplit(".", 1)[-1] if getattr(item, "module", None) else ""
    if module in E2E_MODULES:
        return E2E_MODULES[module]
    if getattr(item, "originalname", item.name) in E2E_TESTS.get(module, ()):
        return "measured over 1 s"
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
