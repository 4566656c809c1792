"""Integration on the bundled SmolLM2-135M: layer labels, agreement with transformers, and a
real SIGKILL in the middle of an extraction followed by a resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import lmgeom
from conftest import paused_at, wait_paused
from lmgeom.activations import extract, load_activations

pytestmark = pytest.mark.slow

TEXTS = [
    "The capital of France is Paris, a city on the Seine.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)",
    "Let x be a real number with x^2 = 9. Then x = 3 or x = -3.",
    "Shares fell on Monday after the central bank raised rates.",
    "Photosynthesis converts light energy into chemical energy.",
]


def test_smollm_layers_and_agreement_with_transformers(smollm):
    acts = extract(smollm, TEXTS, pooling="last", cache=False)
    assert acts.layers == tuple(str(i) for i in range(31)) + ("final",)
    assert acts.states.shape == (32, len(TEXTS), 576)
    captured = {}
    hook = smollm.hf_model.lm_head.register_forward_pre_hook(
        lambda mod, args: captured.__setitem__("x", args[0].detach().clone())
    )
    try:
        for i, text in enumerate(TEXTS):
            x = smollm.tokenizer([text], return_tensors="pt")
            with torch.no_grad():
                out = smollm.hf_model(**x, output_hidden_states=True)
            np.testing.assert_allclose(acts.layer("5")[i], out.hidden_states[5][0, -1].numpy(), rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(acts.layer("final")[i], captured["x"][0, -1].numpy(), rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(acts.layer("final")[i], out.hidden_states[-1][0, -1].numpy(), rtol=1e-4, atol=1e-4)
    finally:
        hook.remove()


def test_sigkill_midway_then_resume_is_identical(tmp_path):
    corpus = tmp_path / "corpus.txt"
    base = [t.replace("\n", " ") for t in TEXTS]
    lines = [f"{base[i % len(base)]} (variant {i}: {' '.join(['word'] * (i % 17))})" for i in range(60)]
    corpus.write_text("\n".join(lines) + "\n")
    env = {**os.environ, "LMGEOM_CACHE": str(tmp_path / "cache"), "LMGEOM_QUIET": "1"}
    (tmp_path / "cache").mkdir()
    real = Path(os.environ["LMGEOM_CACHE"])
    (tmp_path / "cache" / "models").symlink_to((real / "models").resolve(), target_is_directory=True)
    (tmp_path / "cache" / "hashes").symlink_to((real / "hashes").resolve(), target_is_directory=True)
    cmd = [sys.executable, "-m", "lmgeom.cli", "extract", "--texts", str(corpus), "--n", "60",
           "--batch-size", "4", "--max-length", "48", "--layers", "all", "--out", str(tmp_path / "acts"), "--quiet"]
    pauses = tmp_path / "pauses"
    proc = subprocess.Popen(cmd, env={**env, **paused_at(pauses, "extract", 3)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    act_dir = tmp_path / "cache" / "activations"
    wait_paused(proc, pauses, "extract")  # the third batch is stored, the fourth not begun
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_before = len(list(act_dir.glob("*/shard-*.safetensors")))
    assert n_before == 3
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"{15 - n_before} batches computed, {n_before} from cache" in done.stdout
    resumed = load_activations(tmp_path / "acts")
    model = lmgeom.load_model("smollm2-135m")
    texts = lmgeom.load_texts(str(corpus))
    clean = extract(model, texts, batch_size=4, max_length=48, cache=False)
    np.testing.assert_array_equal(resumed.states, clean.states)
