"""Claims D1-D8 end to end on the bundled smollm2-135m with tiny sizes (e2e): every row is
there with a valid verdict, the measurements agree with the experiments they reuse, and a
rerun resumes from the work folder."""

from __future__ import annotations

import json
import math

import numpy as np

from lmgeom.metrics.claims import NOT_TESTABLE, VERDICTS, ModelInfo

SPEC = "smollm2-135m"
INFO = ModelInfo(SPEC, 576, "llama", "instruct", 30)


def _settings(**kw):
    from lmgeom.experiments.claims import DispersionClaimsSettings

    return DispersionClaimsSettings.for_n(
        16, 0, n_boot=100, n_boot_depth=100, hardness_n=8, select_eval=2,
        select_eval_chars=300, knn_train_tokens=512, knn_eval_tokens=128,
        knn_select_tokens=128, knn_chunk_len=32, knn_k=16, finetune_steps=2,
        finetune_eval_chunks=4, finetune_n_texts=12, finetune_seq_len=32, corpus_limit=12,
        **kw)


def _run(tmp_path, only, work_dir=None, runs_dir=None, **kw):
    from lmgeom.experiments.claims import measure_dispersion_claims

    return measure_dispersion_claims([SPEC], [INFO], n=16, seed=0, device="cpu", dtype=None,
                                     work_dir=work_dir or tmp_path / "work", progress=False,
                                     only=only, settings=_settings(**kw), runs_dir=runs_dir)


def test_measured_claims_on_smollm2_rows_agreement_and_resume(tmp_path, smollm):
    from lmgeom.experiments.claims import DispersionClaimsSettings
    from lmgeom.experiments.claims.dispersion import measure_segments
    from lmgeom.experiments.dispersion import measure_chunks

    only = ["D1", "D2", "D4", "D5", "D6", "D7"]
    out = _run(tmp_path, only)
    ids = [v.claim for v in out]
    assert ids == ["D1", "D1.segment", "D1.token", "D2", "D2.segment", "D2.token", "D4", "D5",
                   "D6", "D6.code", "D6.math", "D7", "D7.dispersion", "D7.knn"]
    by = {v.claim: v for v in out}
    json.dumps([v.details for v in out])  # the details go into the manifest
    for v in out:
        assert v.verdict in VERDICTS
        row = v.row()
        assert row["claim"] == v.claim and row["statement"]
        if v.verdict != NOT_TESTABLE:
            assert SPEC in row["models"] and row["widths"] == "576"
            assert v.details["seconds"], v.claim
    # the headline rests on the token variant and says what the segment variant found
    head = by["D1"]
    assert head.details["variant"] == "token"
    assert head.verdict == by["D1.token"].verdict and head.estimate == by["D1.token"].estimate
    assert f"segment variant is {by['D1.segment'].verdict}" in head.reason
    assert by["D4"].verdict == NOT_TESTABLE and "--suite" in by["D4"].reason
    assert by["D6"].verdict == "inconclusive" and "at least 3" in by["D6.code"].reason
    assert math.isfinite(by["D7.knn"].estimate) and math.isfinite(by["D7.dispersion"].estimate)
    assert by["D7"].verdict in VERDICTS and "D7.knn" in by["D7"].reason

    # the token dispersions and perplexities are those of `lmgeom dispersion` on the same chunks
    s = _settings()
    m = measure_segments(smollm, s, tmp_path / "work", False)
    from lmgeom.texts import load_texts

    wiki = load_texts("builtin:wiki", limit=s.corpus_limit, seed=s.seed)
    ref = measure_chunks(smollm, wiki, chunk_len=s.chunk_len, layers="final",
                         max_chunks=s.n, seed=s.seed, cache=False)
    fi = list(m["points"]).index("final")
    np.testing.assert_allclose(m["token"][fi], ref.dispersion[0], atol=1e-5)
    np.testing.assert_allclose(m["perplexity"], ref.perplexity, rtol=1e-5)
    assert m["members"].shape == (len(m["group_perplexity"]), s.group_size)
    assert DispersionClaimsSettings.for_n(0).n == 256

    # a rerun reads every measurement back from the work folder: same numbers
    cached = sorted(p.name for p in (tmp_path / "work").glob("*.npz"))
    assert any(n.startswith("segments-") for n in cached) and any(
        n.startswith("knn-") for n in cached)
    again = _run(tmp_path, only)
    assert [(v.claim, v.verdict) for v in again] == [(v.claim, v.verdict) for v in out]
    for a, b in zip(again, out):
        assert a.estimate == b.estimate or (math.isnan(a.estimate) and math.isnan(b.estimate))


def test_finetune_claims_on_smollm2_row_shape(tmp_path):
    from lmgeom.experiments.claims import dispersion_cache

    # LoRA only: full fine-tuning saves the whole model per arm (the default runs both). As
    # `lmgeom claims` runs it: the measurements in lmgeom's cache, the fine-tuning run (a run
    # folder, which may not lie in the cache) in the claims run's work folder
    out = _run(tmp_path, ["D3", "D8"], finetune_methods=("lora",), work_dir=dispersion_cache(),
               runs_dir=tmp_path / "runs")
    assert [p.name.split("-")[1] for p in (tmp_path / "runs").glob("finetune-*")] == ["lora"]
    assert [v.claim for v in out] == ["D3", "D3.lora", "D8", "D8.lora"]
    for v in out:
        assert v.verdict in VERDICTS and v.verdict != NOT_TESTABLE
        assert v.models == (INFO,)
    by = {v.claim: v for v in out}
    assert by["D3.lora"].details["paired"] is True  # per-chunk before/after from the run
    assert by["D8.lora"].direction == "<" and by["D3.lora"].direction == ">"
    assert "smallest model (smollm2-135m)" in by["D3"].reason


def test_d4_on_a_suite_of_checkpoints(tmp_path):
    """D4 on a suite folder (``<width>/step<N>/`` model folders): identical checkpoints give
    a difference of exactly 0; different weights a finite one; step 0 (random init) is left
    out when two trained checkpoints exist."""
    from conftest import build_tiny
    from lmgeom.experiments.claims.dispersion_models import cluster_verdict

    s = _settings(cluster_max=32)
    for name, seeds in (("same", (1, 1, 1)), ("diff", (0, 1, 2))):
        root = tmp_path / name
        for step, seed in zip((0, 3, 9), seeds):
            build_tiny(root / "w32" / f"step{step}", "llama", seed=seed)
        out = cluster_verdict(str(root), s, tmp_path / "work", False)
        assert [v.claim for v in out] == ["D4", "D4.w32"]
        part = out[1]
        assert part.verdict in VERDICTS and part.verdict != NOT_TESTABLE
        assert "step 9 minus step 3" in part.quantity
        assert part.models[0].d == 32 and part.models[0].name == f"{name}/w32"
        if name == "same":
            assert part.estimate == 0.0 and part.ci_low == 0.0 and part.ci_high == 0.0
        else:
            assert math.isfinite(part.estimate) and part.estimate != 0.0
