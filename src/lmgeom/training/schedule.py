"""The one batch scheduler of lmgeom's training loops (the width suite and fine-tuning).

:class:`BatchSchedule` decides which items (fixed-length token chunks) make up the batch of
each optimiser step. There are ``K`` pools of items (one per training domain; the suite has
one); each step takes ``per_step`` items from every pool. Pool ``k`` is read as the
concatenation of per-epoch permutations ``numpy.random.default_rng([seed, stream_k,
epoch]).permutation(n_k)``: step ``s`` takes positions ``s · per_step ... (s + 1) · per_step −
1`` of that stream. So

* the batch of a step is a pure function of ``(sizes, per_step, seed, streams, step)`` — a run
  resumed at any step continues with exactly the batches of an uninterrupted one;
* every epoch of a pool uses each of its items exactly once;
* two runs with the same seed (every arm of a comparison, every width of a suite) see the
  same data in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import DataError


class BatchSchedule:
    """Which items of each pool make up each step's batch (see the module docstring).

    Args:
        sizes: items per pool ``(n_1, ..., n_K)``, each >= 1.
        per_step: items taken from every pool per step (>= 1).
        seed: the data-order seed.
        streams: per pool, the second seed word of its permutations (default ``0 .. K − 1``).
    """

    def __init__(self, sizes: Sequence[int], per_step: int, seed: int, *,
                 streams: Sequence[int] | None = None) -> None:
        self.sizes = tuple(int(n) for n in sizes)
        if not self.sizes:
            raise DataError("a batch schedule needs at least one pool of training items")
        if min(self.sizes) < 1:
            raise DataError("a training stream is shorter than one sequence; add texts or lower "
                            "the sequence length")
        if int(per_step) < 1:
            raise DataError(f"per_step must be >= 1, got {per_step}")
        self.per_step = int(per_step)
        self.seed = int(seed)
        self.streams = tuple(int(s) for s in (streams if streams is not None
                                              else range(len(self.sizes))))
        if len(self.streams) != len(self.sizes):
            raise DataError(f"{len(self.streams)} streams for {len(self.sizes)} pools")
        self._perms: dict[tuple[int, int], np.ndarray] = {}

    def permutation(self, pool: int, epoch: int) -> np.ndarray:
        """The order of pool ``pool``'s items in epoch ``epoch`` (the last few are cached)."""
        key = (pool, epoch)
        if key not in self._perms:
            if len(self._perms) > 4 * len(self.sizes):
                self._perms = {k: v for k, v in self._perms.items()
                               if k[0] != pool or k[1] >= epoch - 1}
            rng = np.random.default_rng([self.seed, self.streams[pool], epoch])
            self._perms[key] = rng.permutation(self.sizes[pool])
        return self._perms[key]

    def indices(self, step: int) -> list[np.ndarray]:
        """Per pool, the ``(per_step,)`` int64 item indices of step ``step`` (0-based)."""
        if int(step) < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        out = []
        for k, n in enumerate(self.sizes):
            pos = np.arange(step * self.per_step, (step + 1) * self.per_step, dtype=np.int64)
            epochs, within = pos // n, pos % n
            idx = np.empty(len(pos), dtype=np.int64)
            for e in np.unique(epochs):
                sel = epochs == e
                idx[sel] = self.permutation(k, int(e))[within[sel]]
            out.append(idx)
        return out

    def batch(self, step: int) -> np.ndarray:
        """The item indices of step ``step`` of a one-pool schedule."""
        if len(self.sizes) != 1:
            raise ValueError("batch() is for one pool; use indices() with several")
        return self.indices(step)[0]

    def epochs(self, steps: int) -> float:
        """Passes over the data in ``steps`` steps (the fewest of any pool: the largest one's)."""
        return min(steps * self.per_step / n for n in self.sizes)


__all__ = ["BatchSchedule"]
