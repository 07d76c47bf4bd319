"""The GPU's SM clock, power and temperature while a run trains, from nvidia-smi (no torch, no NVML binding).

A step time means little without the clock it ran at: a GPU under sustained tensor-core load settles below its boost
clock once the power and thermal limits bite, and a short run may never get there (README, "Short launches against
long runs").  `GpuTelemetry` runs `nvidia-smi --query-gpu=... --loop-ms=INTERVAL` beside the training loop, stamps each
line with the loop's own clock (time.perf_counter) as it arrives, and `per_step` gives every step the median of the
samples inside it (or the nearest one, for steps shorter than the interval).  Where nvidia-smi is missing or does not
answer, nothing is sampled and the report simply has no clock fields.
"""
from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time

FIELDS = ("sm_mhz", "power_w", "temp_c")
QUERY = "uuid,clocks.sm,power.draw,temperature.gpu"


class GpuTelemetry:
    """nvidia-smi sampling one GPU (`uuid`, or the only GPU listed) every `interval_ms` from start() to stop()."""

    def __init__(self, uuid: str | None = None, interval_ms: int = 500, exe: str = "nvidia-smi"):
        self.uuid = (uuid or "").lower().replace("gpu-", "")
        self.interval_ms = interval_ms
        self.exe = exe
        self.samples: list[tuple[float, float, float, float]] = []  # (perf_counter, sm MHz, W, C)
        self._proc = None
        self._thread = None

    def start(self) -> bool:
        """Start sampling; False (and nothing runs) where nvidia-smi is not on the PATH."""
        path = shutil.which(self.exe)
        if not path:
            return False
        try:
            self._proc = subprocess.Popen([path, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits",
                                           f"--loop-ms={self.interval_ms}"], stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, text=True, bufsize=1)
        except OSError:
            return False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return True

    def _read(self) -> None:
        by_gpu: dict[str, list] = {}
        for line in self._proc.stdout:
            t = time.perf_counter()
            cells = [c.strip() for c in line.split(",")]
            if len(cells) != 4:
                continue
            try:
                by_gpu.setdefault(cells[0].lower(), []).append((t, *(float(c) for c in cells[1:])))
            except ValueError:  # "[N/A]" and the like
                continue
        # the GPU named by uuid; else the only GPU listed (a uuid torch formats otherwise still finds it); else none
        named = [v for k, v in by_gpu.items() if self.uuid and self.uuid in k]
        self.samples = named[0] if named else (next(iter(by_gpu.values())) if len(by_gpu) == 1 else [])

    def stop(self) -> list[tuple[float, float, float, float]]:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._thread.join(timeout=5)
        return list(self.samples)


def per_step(samples: list[tuple], spans: list[tuple[float, float]], reach: float = 1.0) -> list[dict]:
    """For each step span (start, end) on the samples' clock: the median of the samples inside it, or the sample
    nearest its middle when none falls inside (a step shorter than the sampling interval) and that sample lies within
    `reach` seconds of the span (not an idle reading from before the load or after it); {} otherwise."""
    out = []
    for a, b in spans:
        inside = [s for s in samples if a <= s[0] <= b]
        if not inside and samples:
            mid = (a + b) / 2
            near = min(samples, key=lambda s: abs(s[0] - mid))
            inside = [near] if a - reach <= near[0] <= b + reach else []
        out.append({f: statistics.median(s[i + 1] for s in inside) for i, f in enumerate(FIELDS)} if inside else {})
    return out
