"""Helpers shared by the benchmarks: peak-RSS sampling and log-log growth fits."""

from __future__ import annotations

import threading
import time

import numpy as np


def rss_bytes() -> int:
    """Resident set size of this process (``VmRSS`` from ``/proc/self/status``)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class PeakRSS:
    """``with PeakRSS() as p: work()`` samples VmRSS every 2 ms in a background thread;
    ``p.base`` is the RSS just before the block, ``p.peak`` the highest sample (>= base)."""

    def __enter__(self) -> PeakRSS:
        self.base = self.peak = rss_bytes()
        self._stop = False
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop:
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.002)

    def __exit__(self, *exc) -> None:
        self._stop = True
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


def loglog_slope(xs, ts) -> float:
    """Least-squares slope of log(time) on log(size): 1.0 = linear growth."""
    lx, lt = np.log(np.asarray(xs, float)), np.log(np.asarray(ts, float))
    return float(np.polyfit(lx, lt, 1)[0])
