"""``lmgeom claims --n-ladder`` (issue 34): the PGA claims decided at several n in one run.

* the rungs are nested, label-balanced, seeded subsets of the texts;
* ``Activations.subset`` gives the states a forward pass over only those texts would give;
* the growth of |z| with n is measured from the rungs (a planted n^0.5 comes back);
* a verdict that differs between the two largest n is ``unstable``; ``underpowered`` becoming
  decided is not a change;
* on the bundled model: one forward pass, every rung's verdicts in ``claims_ladder.parquet``,
  the rungs' states sliced (no second extraction), and bad ladders refused before any work.

End-to-end half (the unit half is tests/unit/test_claims_ladder.py).
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from lmgeom.cli import main
from lmgeom.metrics.claims import (
    UNDERPOWERED,
    UNSTABLE,
)


@pytest.mark.slow
def test_one_run_decides_every_rung_from_one_forward_pass(tmp_path, capsys):
    out = tmp_path / "lad"
    rc = main(["claims", "--model", "smollm2-135m", "--n-ladder", "24,48", "--only", "P2,P5",
               "--n-null", "20", "--quiet", "--out", str(out)])
    assert rc == 0
    top = pd.read_parquet(out / "claims.parquet").set_index("claim")
    lad = pd.read_parquet(out / "claims_ladder.parquet")
    assert sorted(lad.n_texts.unique()) == [24, 48]
    assert set(lad.claim) == {"P2", "P2.zone", "P2.recovery", "P5"}
    at48 = lad[lad.n_texts == 48].set_index("claim")
    at24 = lad[lad.n_texts == 24].set_index("claim")
    for c in ("P2", "P5"):  # the headline is the largest n's verdict, or unstable if it moved
        want = (UNSTABLE if at48.loc[c, "verdict"] != at24.loc[c, "verdict"]
                and at24.loc[c, "verdict"] != UNDERPOWERED else at48.loc[c, "verdict"])
        assert top.loc[c, "verdict"] == want
    assert at24.loc["P2", "n"] == 24 and at48.loc["P2", "n"] == 48
    layers = pd.read_parquet(out / "layers_ladder.parquet")
    assert set(layers.n_texts) == {24}
    pc1 = layers[layers.metric == "pc1_share"]
    assert set(pc1.n.astype(int)) == {24}  # the rung's states: 24 texts
    man = json.loads((out / "manifest.json").read_text())
    assert man["readout_k"]["ladder_k"] == {"24": 12}  # 24 - 10 - 2
    assert man["readout_k"]["k"] == 36
    tm = man["timings"]
    assert "pga.sweep.ladder_s[smollm2-135m]" in tm
    assert len(man["loaded_models"]) == 1  # one extraction; the rung was sliced from it

    # the same n on its own: the same texts (the rung's), the same k, the same verdicts
    alone = tmp_path / "alone"
    capsys.readouterr()
    rc = main(["claims", "--model", "smollm2-135m", "--n", "24", "--only", "P2,P5",
               "--n-null", "20", "--quiet", "--out", str(alone)])
    assert rc == 0, capsys.readouterr().err
    one = pd.read_parquet(alone / "claims.parquet").set_index("claim")
    assert set(one.index) == set(at24.index)
    for c in one.index:
        assert one.loc[c, "verdict"] == at24.loc[c, "verdict"], (c, one.loc[c, "reason"],
                                                                   at24.loc[c, "reason"])
    assert json.loads((alone / "manifest.json").read_text())["readout_k"]["k"] == 12
