"""The metrics stage of ``lmgeom analyze`` at its defaults (32 layers x CCR 0, 1, 5, 10 x 100
null frames, N = 512, d = 576, k = 100, exact pairs, seed 0, plus the PC1 share and the
spectral summary per layer), new code vs the code of git revision ``fe8b15f`` (before
:func:`~lmgeom.metrics.subspace_pga_levels`), each in its own subprocess on the same saved
states, one after the other in the same run. Old: one ``subspace_pga`` call per level (what
``experiments/layer_sweep.py`` ``layer_metrics`` does at that revision). New:
``subspace_pga_levels(X, V, ccr=(0, 1, 5, 10), ...)`` with the default precision (float64 in
exact mode), and with ``precision="float32"``; and, when ``LMGEOM_BENCH_BEFORE`` names the
``src`` folder of another tree (e.g. ``git archive HEAD | tar -x -C /tmp/before`` before a
change), the same ``subspace_pga_levels`` call on that tree ("before"), with ``max |dz|``
and ``max |dnull|`` against it (0 when the change keeps the numbers bit for bit). One warm-up layer runs first in each process
(imports, and the null frames into the in-process cache, as after analyze's first layer).
``ratio`` = old seconds / new seconds (wall; ``cpu_ratio`` the same in CPU seconds).
``max |dz|`` is over all 32 x 4 (layer, level) z values against the old code.

States: ``real`` = smollm2-135m last-token states of the 512 default texts (``lmgeom extract
--n 512``, float32; the 32 layers 0..30 and ``final``, as analyze measures them; an existing
extraction can be named by ``LMGEOM_BENCH_STATES``); ``synthetic`` (when the model is not
available, and in the ``full`` profile) = 32 layers of Gaussian states with a geometric
spectrum plus a strong rank-4 anisotropic component and a common offset.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

OLD_REV = "fe8b15f"
LEVELS = (0, 1, 5, 10)
N, D, K, N_NULL, LAYERS = 512, 576, 100, 100, 32
ROOT = Path(__file__).resolve().parent.parent

_CHILD = r"""
import json, sys, time
import numpy as np
mode, data_path, out_path = sys.argv[1:4]
import lmgeom.metrics as M
z = np.load(data_path)
states, V = z["states"], z["basis"]
levels = (0, 1, 5, 10)

def layer(X):
    if mode == "old":
        r = {m: M.subspace_pga(X, V, n_null=100, ccr=m, seed=0) for m in levels}
    else:
        prec = "float32" if mode == "new-fp32" else "auto"
        r = M.subspace_pga_levels(X, V, ccr=levels, n_null=100, seed=0, precision=prec)
    M.pc1_readout_share(X, V)
    M.spectral_summary(X)
    return [[float(r[m].z), float(r[m].rho_readout)] + list(map(float, r[m].null))
            for m in levels]

layer(states[0])
t, c = time.perf_counter(), time.process_time()
zs = [layer(X) for X in states]
wall, cpu = time.perf_counter() - t, time.process_time() - c
json.dump({"wall": wall, "cpu": cpu, "z": zs}, open(out_path, "w"))
"""


def synthetic_states(n: int = N, d: int = D, layers: int = LAYERS, seed: int = 0):
    """(layers, n, d) Gaussian + rank-4 anisotropic component + offset, and a readout basis."""
    from lmgeom.metrics import readout_basis

    rng = np.random.default_rng(seed)
    out = np.empty((layers, n, d), dtype=np.float32)
    for layer in range(layers):
        spectrum = np.geomspace(3.0, 0.05, d)[rng.permutation(d)]
        X = rng.standard_normal((n, d)) * spectrum
        U = rng.standard_normal((n, 4)) * np.array([40.0, 15.0, 8.0, 4.0]) * (1 + layer / 8)
        X += U @ np.linalg.qr(rng.standard_normal((d, 4)))[0].T
        X += 10.0 * rng.standard_normal(d)
        out[layer] = X
    W = rng.standard_normal((4000, d)) * np.geomspace(0.2, 3.0, d)[rng.permutation(d)]
    return out, readout_basis(W, K)


def real_states(path: str | None, tmp: Path):
    """smollm2-135m states (an ``lmgeom extract`` run at ``path``, or a fresh one: cached by
    lmgeom after the first time) and the model's readout basis (raw W_U, k = 100)."""
    import lmgeom
    from lmgeom.metrics import readout_basis

    if not path:
        path = str(tmp / "smollm2")
        cmd = [str(Path(sys.executable).with_name("lmgeom")), "extract", "--model",
               "smollm2-135m", "--n", str(N), "--out", path, "--quiet"]
        subprocess.run(cmd, check=True, capture_output=True, env={**os.environ,
                                                                   "LMGEOM_QUIET": "1"})
    acts = lmgeom.load_activations(path)
    W = lmgeom.load_model("smollm2-135m").W_U.detach().float().cpu().numpy()
    return np.asarray(acts.states, dtype=np.float32), readout_basis(W, K)


def _old_tree(tmp: Path) -> Path:
    tree = tmp / "lmgeom-old"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), OLD_REV],
                   check=True, capture_output=True)
    return tree


def _child(mode: str, src: Path, data: Path, out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    env.pop("OMP_NUM_THREADS", None)
    r = subprocess.run([sys.executable, "-c", _CHILD, mode, str(data), str(out)], env=env,
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{mode} metrics run failed:\n{r.stderr[-3000:]}")
    return json.loads(out.read_text())


def _datasets(profile: str, tmp: Path) -> list[tuple[np.ndarray, np.ndarray, str]]:
    out = []
    try:
        S, V = real_states(os.environ.get("LMGEOM_BENCH_STATES"), tmp)
        out.append((S, V, f"real smollm2-135m ({S.shape[0]} layers, N={S.shape[1]})"))
    except Exception as exc:  # noqa: BLE001 - no model here: synthetic states only
        print(f"(real states unavailable: {exc}; using synthetic)", file=sys.stderr)
    if not out or profile == "full":
        S, V = synthetic_states()
        out.append((S, V, f"synthetic ({S.shape[0]} layers, N={S.shape[1]})"))
    return out


def run(profile: str = "quick") -> list[dict]:
    """``quick``: the real states (synthetic without the model); ``full``: both; ``small``:
    the first 8 layers, without the old revision (for a before/after check of a change)."""
    rows: list[dict] = []
    names = {"old": f"old ({OLD_REV}): subspace_pga per level",
             "new": "new: subspace_pga_levels (float64)",
             "before": "before (LMGEOM_BENCH_BEFORE): subspace_pga_levels (float64)",
             "new-fp32": 'new: subspace_pga_levels (precision="float32")'}
    with tempfile.TemporaryDirectory(prefix="lmgeom-bench-metrics-") as tmp_s:
        tmp = Path(tmp_s)
        small = profile == "small"
        tree = None if small else _old_tree(tmp)
        try:
            for i, (S, V, what) in enumerate(_datasets(profile, tmp)):
                if small:
                    S, what = S[:8], f"{what}, first 8 layers"
                data = tmp / f"states{i}.npz"
                np.savez(data, states=S, basis=V)
                res = {}
                before = os.environ.get("LMGEOM_BENCH_BEFORE")
                modes = [("new", ROOT / "src"), ("new-fp32", ROOT / "src")]
                if tree is not None:
                    modes.insert(0, ("old", tree / "src"))
                if before:
                    modes[1:1] = [("before", Path(before)), ("new", ROOT / "src"),
                                  ("before", Path(before))]
                for mode, src in modes:
                    load = os.getloadavg()[0]
                    got = _child(mode, src, data, tmp / f"{mode}{i}.json")
                    print(f"  metrics {what} {mode}: {got['wall']:.1f} s", flush=True)
                    got["load"] = load
                    if mode in res:  # run twice (before/new interleaved): the faster run
                        np.testing.assert_array_equal(got["z"], res[mode]["z"])
                        got = min(got, res[mode], key=lambda r: r["wall"])
                    res[mode] = got
                old = res.get("old")
                for mode, r in res.items():
                    z = np.asarray(r["z"])[:, :, 0]
                    extra = {}
                    if "before" in res and mode != "old":
                        zb = np.asarray(res["before"]["z"])
                        extra = {"max_abs_dz_vs_before": float(np.max(np.abs(
                                     np.asarray(r["z"])[:, :, 0] - zb[:, :, 0]))),
                                 "max_abs_dnull_vs_before": float(np.max(np.abs(
                                     np.asarray(r["z"])[:, :, 2:] - zb[:, :, 2:]))),
                                 "ratio_vs_before": res["before"]["wall"] / r["wall"],
                                 "cpu_ratio_vs_before": res["before"]["cpu"] / r["cpu"]}
                    rows.append({
                        "bench": "metrics", "states": what, "name": names[mode],
                        "seconds": r["wall"], "cpu_seconds": r["cpu"],
                        **({} if old is None else {
                            "ratio": old["wall"] / r["wall"], "cpu_ratio": old["cpu"] / r["cpu"],
                            "max_abs_dz_vs_old": float(np.max(np.abs(
                                z - np.asarray(old["z"])[:, :, 0])))}), **extra,
                        "notes": f"{S.shape[0]} layers x CCR {','.join(map(str, LEVELS))} x "
                                 f"{N_NULL} nulls, exact pairs; load avg before {r['load']:.2f}",
                    })
        finally:
            if tree is not None:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(tree)], capture_output=True, check=False)
    return rows


if __name__ == "__main__":
    for r in run(sys.argv[1] if len(sys.argv) > 1 else "quick"):
        print(r)
