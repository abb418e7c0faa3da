"""How busy a trial keeps its GPU, and why there is none when CUDA is unusable.

`DeviceMonitor`: a daemon thread samples NVML's utilisation (`torch.cuda.utilization`, through
nvidia-ml-py: the ``gpu`` extra) every ``period_s`` while the epoch trains — it never touches the
training stream, so it adds no synchronisation; the peak memory is this process's CUDA caching
allocator's. The two measure different things: ``gpu_util`` is device-wide (packed trials on one
GPU all see their sum), ``gpu_mem_gib`` is this trial's process only (what its
``set_per_process_memory_fraction`` cap limits). On the CPU the keys are left out, never guessed.

`cuda_unavailable_reason`: torch's own words for a CUDA it cannot use (no driver, a driver too
old for this torch, no device visible) with the driver and CUDA versions, on one line.
"""

from __future__ import annotations

import threading
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

__all__ = ["DeviceMonitor", "cuda_unavailable_reason"]

_warned: set[str] = set()  # NVML failures already warned about in this process


class DeviceMonitor:
    """``with DeviceMonitor(device) as m:`` around an epoch's training pass, ``m.stop()`` at its
    end (the ``with`` stops the sampler thread even when the pass raises): returns
    ``{"gpu_util": device-wide mean % of time a kernel ran, "gpu_mem_gib": this process's peak
    allocated GiB}`` on CUDA
    (`calibtune.metrics.keys.GPU_KEYS`), ``{}`` elsewhere. Without NVML ``gpu_util`` is missing
    and one warning per process says why.

    >>> DeviceMonitor(torch.device("cpu")).start().stop()
    {}
    """

    def __init__(self, device: torch.device, period_s: float = 0.25) -> None:
        self.device, self.period_s = torch.device(device), period_s
        self.cuda = self.device.type == "cuda" and torch.cuda.is_available()
        self._samples: list[float] = []
        self._error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> DeviceMonitor:
        if not self.cuda:
            return self
        torch.cuda.reset_peak_memory_stats(self.device)
        self._samples, self._error, self._stop = [], None, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True, name="calibtune-gpu")
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self._samples.append(float(torch.cuda.utilization(self.device)))
            except Exception as exc:  # no NVML (nvidia-ml-py) here: utilisation not reported
                self._error = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
                return

    def _halt(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def stop(self) -> dict[str, Any]:
        if not self.cuda:
            return {}
        self._halt()
        out: dict[str, Any] = {"gpu_mem_gib": torch.cuda.max_memory_allocated(self.device) / 2**30}
        if self._samples:
            out["gpu_util"] = sum(self._samples) / len(self._samples)
        elif self._error is not None and self._error not in _warned:
            _warned.add(self._error)
            warnings.warn(
                f"gpu_util: not reported, NVML failed ({self._error}); install calibtune[gpu]",
                RuntimeWarning,
                stacklevel=2,
            )
        return out

    def __enter__(self) -> DeviceMonitor:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._halt()  # also when the pass raised: no sampler thread outlives its epoch


def _driver_version() -> str:
    proc = Path("/proc/driver/nvidia/version")  # Linux: present whenever the kernel module is
    try:
        line = proc.read_text().splitlines()[0]
    except (OSError, IndexError):
        line = ""
    words = [w for w in line.split() if w[:1].isdigit() and "." in w]
    if words:
        return words[0]
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        return str(pynvml.nvmlSystemGetDriverVersion())
    except Exception:
        return "none found"


def cuda_unavailable_reason() -> str:
    """Why this process cannot use CUDA, in torch's words (the error of initialising CUDA, or
    the warnings of ``torch.cuda.is_available()``), with the NVIDIA driver version and the CUDA
    version this torch was built for; one line. ``""`` when CUDA is usable.

    >>> r = cuda_unavailable_reason()
    >>> r == "" or "; NVIDIA driver " in r
    True
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            available = torch.cuda.is_available()
            if available:
                return ""
            torch.cuda.init()  # raises torch's reason (no driver, too old, no device)
            reason = "torch.cuda.is_available() is False"
        except Exception as exc:
            reason = str(exc)
    said = [str(w.message) for w in caught]
    reason = " ".join(" ".join([reason, *said]).split())[:400]
    built = torch.version.cuda or "none (a CPU build of torch)"
    return f"torch says: {reason}; NVIDIA driver {_driver_version()}, torch built for CUDA {built}"
