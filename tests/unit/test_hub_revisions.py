"""Hub revisions offline, for real: a local Hugging Face hub cache with two checkpoints of a
tiny GPT-NeoX (``refs/step64``, ``refs/step128``), resolved by the real ``huggingface_hub`` /
``transformers`` code with ``HF_HUB_OFFLINE=1`` — the path a Pythia user's
``--revision stepN`` takes, minus the download.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import lmgeom
from conftest import CORPUS, build_tiny
from lmgeom.cli import main
from lmgeom.errors import ModelError

REPO = "tinyorg/tiny-neox"
REVISIONS = {"step64": 0, "step128": 1}  # revision -> seed of its weights


def build_hub_cache(root: Path, src_root: Path, repo: str = REPO,
                    revisions: dict[str, int] = REVISIONS) -> dict[str, Path]:
    """Write the ``huggingface_hub`` cache layout for ``repo``: one snapshot per revision
    (``snapshots/<commit>/`` of symlinks into content-addressed ``blobs/``) and a
    ``refs/<revision>`` file holding the commit. Returns revision -> source model folder."""
    org, name = repo.split("/")
    base = root / f"models--{org}--{name}"
    (base / "blobs").mkdir(parents=True, exist_ok=True)
    (base / "refs").mkdir(exist_ok=True)
    sources = {}
    for rev, seed in revisions.items():
        src = build_tiny(src_root / rev, "gpt_neox", seed=seed)
        commit = hashlib.sha1(f"{repo}@{rev}".encode()).hexdigest()
        snap = base / "snapshots" / commit
        snap.mkdir(parents=True)
        for f in sorted(src.iterdir()):
            data = f.read_bytes()
            blob = base / "blobs" / hashlib.sha256(data).hexdigest()
            if not blob.exists():
                blob.write_bytes(data)
            (snap / f.name).symlink_to(os.path.relpath(blob, snap))
        (base / "refs" / rev).write_text(commit)
        sources[rev] = src
    return sources


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-home")
    sources = build_hub_cache(root / "hub", tmp_path_factory.mktemp("ckpts"))
    return root, sources


@pytest.fixture
def offline(hub, monkeypatch):
    """Point the real hub code at the local cache, offline. ``huggingface_hub`` reads its
    environment once at import, so its constants are set too (the env for anything later)."""
    from huggingface_hub import constants

    root, _ = hub
    monkeypatch.setenv("HF_HOME", str(root))
    monkeypatch.setenv("HF_HUB_CACHE", str(root / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HOME", str(root))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hub


def _state(folder_or_model):
    m = folder_or_model if isinstance(folder_or_model, lmgeom.LanguageModel) else \
        lmgeom.load_model(str(folder_or_model))
    return {k: v.detach().clone() for k, v in m.hf_model.state_dict().items()}


def test_load_model_resolves_each_revision(offline):
    root, sources = offline
    for rev in REVISIONS:
        m = lmgeom.load_model(REPO, revision=rev, device="cpu")
        want = _state(sources[rev])
        got = _state(m)
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want), rev
        commit = (root / "hub" / "models--tinyorg--tiny-neox" / "refs" / rev).read_text()
        assert m.identity["revision"] == rev and m.identity["commit"] == commit
        # the weights hash is the saved folder's: identical checkpoints are detected on the hub
        from lmgeom.models.load import weights_hash

        assert m.identity["weights_sha256"] == weights_hash(sources[rev])
    a, b = (_state(sources[r]) for r in REVISIONS)
    assert not torch.equal(a["gpt_neox.embed_in.weight"], b["gpt_neox.embed_in.weight"])
    with pytest.raises(ModelError, match="revision 'step999'.*HF_HUB_OFFLINE"):
        lmgeom.load_model(REPO, revision="step999", device="cpu")


def test_sweep_over_offline_revisions(offline, tmp_path, capsys):
    root, sources = offline
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(CORPUS[:12]) + "\n")
    common = ["--texts", str(texts), "--n", "12", "--layers", "0,2,final", "--n-null", "5",
              "--ccr", "1", "--k", "4", "--max-length", "32", "--no-report", "--no-logit-lens",
              "--quiet", "--device", "cpu"]
    out = tmp_path / "sweep"
    rc = main(["sweep", "--model", REPO, "--revision", "step64", "--revision", "step128",
               "--out", str(out), *common])
    assert rc == 0
    print(capsys.readouterr().out)
    df = pd.read_parquet(out / "sweep.parquet")
    assert set(df["revision"]) == {"step64", "step128"} and set(df["model"]) == {REPO}
    refs = root / "hub" / "models--tinyorg--tiny-neox" / "refs"
    jobs = json.loads((out / "manifest.json").read_text())["jobs"]
    assert {j["revision"]: j["commit"] for j in jobs} == {
        rev: (refs / rev).read_text() for rev in REVISIONS}

    # each revision's rows equal a sweep of that checkpoint's own folder (the same weights)
    for rev, src in sources.items():
        ref_out = tmp_path / f"ref-{rev}"
        assert main(["sweep", "--model", str(src), "--out", str(ref_out), *common]) == 0
        ref = pd.read_parquet(ref_out / "sweep.parquet")
        key = ["metric", "layer", "setting"]
        got = df[df["revision"] == rev].set_index(key)["value"].sort_index()
        want = ref.set_index(key)["value"].sort_index()
        want = want[~want.index.get_level_values("metric").isin(["weights_sha256"])]
        common_idx = got.index.intersection(want.index)
        assert len(common_idx) > 10
        np.testing.assert_allclose(got[common_idx].to_numpy(dtype=float),
                                   want[common_idx].to_numpy(dtype=float), rtol=0, atol=1e-9)

    # and the two revisions differ (different weights, different geometry)
    a = df[df["revision"] == "step64"].set_index(["metric", "layer", "setting"])["value"]
    b = df[df["revision"] == "step128"].set_index(["metric", "layer", "setting"])["value"]
    both = a.index.intersection(b.index)
    assert not np.allclose(a[both].to_numpy(dtype=float), b[both].to_numpy(dtype=float))
