"""The GPU's SM clock, power and temperature while a run trains, from nvidia-smi (no torch, no NVML binding).

A step time means little without the clock it ran at: a GPU under sustained tensor-core load settles below its boost
clock once the power and thermal limits bite, and a short run may never get there (README, "Short launches against
long runs").  `GpuTelemetry` runs `nvidia-smi --query-gpu=... --loop-ms=INTERVAL` beside the training loop, stamps each
line with the loop's own clock (time.perf_counter) as it arrives, and `per_step` gives every step the median of the
samples inside it (or the nearest one, for steps shorter than the interval).  Where nvidia-smi is missing or does not
answer, nothing is sampled and the report simply has no clock fields.
"""
from __future__ import annotations

import atexit
import shutil
import statistics
import subprocess
import threading
import time

FIELDS = ("sm_mhz", "power_w", "temp_c")
QUERY = "uuid,clocks.sm,power.draw,temperature.gpu"


def _norm(uuid: str | None) -> str:
    """torch's and nvidia-smi's spellings of a GPU's UUID, made comparable (nvidia-smi prefixes "GPU-")."""
    return (uuid or "").lower().replace("gpu-", "")


def _add(by_gpu: dict, line: str, t: float) -> None:
    """One csv line of QUERY into by_gpu[uuid] as (t, SM MHz, W, C).  A line it cannot read ("[N/A]") adds no
    sample, but its GPU is listed all the same: a named GPU without readings is not replaced by another one."""
    cells = [c.strip() for c in line.split(",")]
    if len(cells) != 4:
        return
    samples = by_gpu.setdefault(cells[0].lower(), [])
    try:
        samples.append((t, *(float(c) for c in cells[1:])))
    except ValueError:
        return


def _pick(by_gpu: dict, uuid: str) -> list:
    """The samples of the GPU named by uuid; else of the only GPU listed (a uuid torch formats otherwise still finds
    it); else none: with several GPUs listed and none named, no single GPU's reading."""
    named = [v for k, v in by_gpu.items() if uuid and uuid in k]
    return named[0] if named else (next(iter(by_gpu.values())) if len(by_gpu) == 1 else [])


def query_once(uuid: str | None = None, exe: str = "nvidia-smi") -> tuple[float, float, float] | None:
    """(SM MHz, W, C) of one GPU now (calibrate --sustained reads it once a window), or None where nvidia-smi is
    missing, does not answer, or lists no such GPU."""
    path = shutil.which(exe)
    if not path:
        return None
    try:
        out = subprocess.run([path, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    by_gpu: dict = {}
    for line in out.splitlines():
        _add(by_gpu, line, 0.0)
    got = _pick(by_gpu, _norm(uuid))
    return got[0][1:] if got else None


class GpuTelemetry:
    """nvidia-smi sampling one GPU (`uuid`, or the only GPU listed) every `interval_ms` from start() to stop()."""

    def __init__(self, uuid: str | None = None, interval_ms: int = 500, exe: str = "nvidia-smi"):
        self.uuid = _norm(uuid)
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
        atexit.register(self.stop)  # a run that raises does not leave nvidia-smi looping behind it
        return True

    def _read(self) -> None:
        by_gpu: dict[str, list] = {}
        for line in self._proc.stdout:
            _add(by_gpu, line, time.perf_counter())
        self.samples = _pick(by_gpu, self.uuid)

    def stop(self) -> list[tuple[float, float, float, float]]:
        """Stop sampling (again: a no-op) and return the samples."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        if self._thread is not None:
            self._thread.join(timeout=5)  # the reader sets the samples once nvidia-smi's output ends
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
