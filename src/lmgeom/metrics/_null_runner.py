"""Runs the null loop's frame jobs on workers: one ranking path per device.

On the CPU (``device=None`` / ``"cpu"``) a ``lmgeom.metrics._cpu_worker.CpuWorker`` per
thread ranks through the compiled kernel (``lmgeom.metrics._rank_kernel``); on a torch
device one ``lmgeom.metrics._device_worker.TorchWorker`` ranks with ``torch.sort``. When
numba is missing or broken, the CPU runs the torch worker on the CPU (logged once; float64
frames). :class:`Runner` hands frames to one or more workers (threads: the kernel, BLAS and
numpy release the GIL; BLAS is then limited to one thread per worker) and returns results in
submission order, so results do not depend on scheduling.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

from threadpoolctl import threadpool_limits

from lmgeom.metrics._common import config_error
from lmgeom.metrics._cpu_worker import CpuWorker
from lmgeom.metrics._device_worker import TorchWorker
from lmgeom.metrics._rank_kernel import MAX_PAIRS, kernel_available

log = logging.getLogger(__name__)

__all__ = ["Runner"]

_PARALLEL_MIN_PAIRS = 20_000


@contextlib.contextmanager
def _torch_single_thread() -> Iterator[None]:
    """One torch intra-op thread while several worker threads run (restored afterwards)."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(prev)


def _resolve_device(device: Any, label: str | None) -> Any:
    """None / "cpu" -> the CPU worker (returns None); anything else -> a torch.device."""
    if device is None or (isinstance(device, str) and device == "cpu"):
        return None
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise config_error(f"device={device!r} is not a valid torch device: {exc}", label) from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise config_error(
            f"device={device!r} requested but torch.cuda.is_available() is False; "
            "use device=None (CPU)",
            label,
        )
    if dev.type == "mps":
        raise config_error("device='mps' has no float64 support; use device=None (CPU)", label)
    return dev


class Runner:
    """Runs frame jobs on one or more workers and returns results in order."""

    def __init__(self, P: int, *, device: Any = None, workers: int | None = None,
                 label: str | None = None) -> None:
        dev = _resolve_device(device, label)
        if P > MAX_PAIRS:
            raise config_error(
                f"{P} pairs is more than the {MAX_PAIRS} one correlation can rank; use "
                "pairs=2_000_000 (a seeded sample) or fewer rows", label)
        if dev is None and not kernel_available():
            import torch  # the fallback: torch's sort on the CPU (kernel_available logged it)

            dev = torch.device("cpu")
        self.torch_device = dev
        if dev is not None:
            self.workers = 1
            self.main = TorchWorker(P, dev, label)
            self._pool: list[Any] = []
        else:
            if workers is None:
                workers = min(2, os.cpu_count() or 1) if P >= _PARALLEL_MIN_PAIRS else 1
            if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
                raise config_error(f"workers must be a positive integer; got {workers!r}", label)
            self.workers = workers
            self.main = CpuWorker(P, label)
            self._pool = [CpuWorker(P, label) for _ in range(workers - 1)]
            if workers > 1:
                log.debug("pairwise machinery: %d worker threads, ~%.1f GB buffers each",
                          workers, 16 * P / 1e9)

    def map(self, fn: Callable[[Any, Any], float], jobs: Iterable[Any]) -> list[float]:
        """``[fn(worker, job) for job in jobs]``, in parallel over workers when > 1.

        BLAS (and torch's intra-op pool) run single-threaded meanwhile: each frame's matrix
        products are small, and multi-threaded BLAS on them costs more than it gains
        (measured 2-4x more CPU time on a 2-core machine).
        """
        with ExitStack() as stack:
            if self.torch_device is None:
                stack.enter_context(threadpool_limits(limits=1, user_api="blas"))
                stack.enter_context(_torch_single_thread())
            if self.workers == 1:
                return [fn(self.main, job) for job in jobs]
            free: queue.Queue = queue.Queue()
            for w in [self.main, *self._pool]:
                free.put(w)

            def call(job: Any) -> float:
                w = free.get()
                try:
                    return fn(w, job)
                finally:
                    free.put(w)

            results: list[float] = []
            ex = stack.enter_context(ThreadPoolExecutor(max_workers=self.workers))
            pending: deque = deque()
            for job in jobs:
                pending.append(ex.submit(call, job))
                if len(pending) >= 2 * self.workers:
                    results.append(pending.popleft().result())
            while pending:
                results.append(pending.popleft().result())
            return results

