"""How busy a trial keeps its GPU: mean utilisation and peak memory of each training pass.

A daemon thread samples NVML's utilisation (`torch.cuda.utilization`, through nvidia-ml-py)
every ``period_s`` while the epoch trains — it never touches the training stream, so it adds no
synchronisation; the peak memory is the CUDA caching allocator's. On the CPU (or without NVML)
the keys it cannot measure are left out, never guessed.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

__all__ = ["DeviceMonitor"]


class DeviceMonitor:
    """``start()`` before an epoch's training pass, ``stop()`` after it: returns
    ``{"gpu_util": mean % of time a kernel ran, "gpu_mem_gib": peak allocated GiB}`` on CUDA
    (`calibtune.metrics.keys.GPU_KEYS`), ``{}`` elsewhere.

    >>> DeviceMonitor(torch.device("cpu")).start().stop()
    {}
    """

    def __init__(self, device: torch.device, period_s: float = 0.25) -> None:
        self.device, self.period_s = torch.device(device), period_s
        self.cuda = self.device.type == "cuda" and torch.cuda.is_available()
        self._samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> DeviceMonitor:
        if not self.cuda:
            return self
        torch.cuda.reset_peak_memory_stats(self.device)
        self._samples, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True, name="calibtune-gpu")
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self._samples.append(float(torch.cuda.utilization(self.device)))
            except Exception:  # no NVML (nvidia-ml-py) here: utilisation is not reported
                return

    def stop(self) -> dict[str, Any]:
        if not self.cuda:
            return {}
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        out: dict[str, Any] = {"gpu_mem_gib": torch.cuda.max_memory_allocated(self.device) / 2**30}
        if self._samples:
            out["gpu_util"] = sum(self._samples) / len(self._samples)
        return out
