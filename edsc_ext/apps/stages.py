"""Where a video run's time goes: the stage profile of ``edsc-interpolate --video``.

The frames pass six stages: **decode** (the decode thread: FFmpeg's decoder, the copy of the planes into
page-locked memory, the scene thumbnail), **upload** (host to device and the colour conversion to the
network's input), **network**, **download** (the conversion to the output's layout and device to host),
**encode** (the encode thread: the frame handed to the encoder, e.g. x264) and **mux** (packets written into
the file, the copied audio with them). Each stage records the intervals it was busy: host stages with the
clock of the thread doing the work, device stages (CUDA) with events on the streams the work runs on,
read after the work is done (on the CPU the device stages are host time too). From them:

- **time**: how long the stage was busy (the union of its intervals), and **frames/s**: the frames it
  handled per second of that time, the rate it could keep up alone;
- **busy**: that time as a share of the run's wall time (from the first frame read to the last packet
  written); the stage busy the largest share **bounds** the run (the others wait for it);
- **CPU cores**: the CPU time of the threads doing the stage's work over the wall time: the decode
  thread and FFmpeg's decoder threads, the encode thread and the encoder's threads (x264 runs its own),
  the main thread that queues the device work; and the whole process's. Read from Linux's per-thread
  ``/proc`` files (elsewhere: the process total only);
- **overlap**: the share of the network's busy time during which the decode and the encode stages
  were busy too (the pipeline overlaps them; a serial one would show 0).

It is collected on every run (the clocks and events cost microseconds a frame); ``edsc-interpolate
--profile`` prints the table, and the closing line names the bound.
"""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from array import array
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch

__all__ = ["STAGES", "StageProfile", "StageRow", "process_start_time", "cpu_cores"]

STAGES = ("decode", "upload", "network", "download", "encode", "mux")
DEVICE_STAGES = ("upload", "network", "download")
STAGE_NAMES = {"decode": "decode", "upload": "upload and colour conversion", "network": "network",
               "download": "conversion and download", "encode": "encode", "mux": "mux"}
# Spans of device work read back once this many are waiting (their events are then long done).
_HARVEST_EVERY = 256


def cpu_cores() -> int:
    """The cores this process may run on: its CPU affinity, further limited by a cgroup CPU quota
    (a container's ``cpu.max``) where one is set."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = max(1, min(cores, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def process_start_time() -> Optional[float]:
    """When this process started (seconds since the epoch, like ``time.time()``), from Linux's
    ``/proc`` (to 10 ms); None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        with open("/proc/stat") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith("btime"))
        ticks = float(stat[stat.rfind(")") + 2:].split()[19])
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError, IndexError, AttributeError):
        return None


def _thread_ids() -> set:
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def _thread_times(tids: Iterable[int]) -> Tuple[float, float]:
    """(CPU seconds, seconds waiting on a run queue) of these threads, so far (0 for ended ones)."""
    cpu = wait = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
            fields = stat[stat.rfind(")") + 2:].split()
            cpu += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, ValueError, IndexError):
            continue
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                wait += int(f.read().split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            pass
    return cpu, wait


@dataclass
class _Group:
    """Threads whose CPU time is one stage's: the stage's own thread and those its library started."""

    tids: set = field(default_factory=set)
    start: Optional[Tuple[float, float]] = None
    end: Optional[Tuple[float, float]] = None


class _Intervals:
    """Busy intervals (seconds on the profile's clock), appended in any order; compact."""

    def __init__(self):
        self.starts, self.ends = array("d"), array("d")
        self.frames = 0

    def add(self, start: float, end: float, frames: int) -> None:
        self.starts.append(start)
        self.ends.append(max(start, end))
        self.frames += frames

    def merged(self) -> List[Tuple[float, float]]:
        spans = sorted(zip(self.starts, self.ends))
        out: List[List[float]] = []
        for start, end in spans:
            if out and start <= out[-1][1]:
                out[-1][1] = max(out[-1][1], end)
            else:
                out.append([start, end])
        return [(a, b) for a, b in out]


def _length(spans: Sequence[Tuple[float, float]]) -> float:
    return sum(b - a for a, b in spans)


def _intersection(a: Sequence[Tuple[float, float]], b: Sequence[Tuple[float, float]]) -> float:
    """The length of the intersection of two sorted, merged interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


@dataclass
class StageRow:
    """One row of the profile: a stage (on one device, for the device stages of several)."""

    stage: str
    name: str
    seconds: float
    frames: int
    busy: float  # share of the wall time
    cpu_cores: Optional[float] = None  # CPU time of the stage's threads / wall time
    note: str = ""

    @property
    def rate(self) -> Optional[float]:
        return self.frames / self.seconds if self.seconds > 0 else None


class StageProfile:
    """Collects the stages' busy intervals during one run (see the module's docstring). The threads
    call :meth:`host` (a block of host work) and :meth:`device` (a block of device work on a stream);
    :meth:`begin` and :meth:`finish` bracket the run; :meth:`rows` and :meth:`summary` report it."""

    def __init__(self):
        self.clock = time.perf_counter
        self._lock = threading.Lock()
        self._intervals: Dict[Tuple[str, str], _Intervals] = {}
        self._pending: List[tuple] = []  # (stage, device name, start event, end event, frames)
        self._references: Dict[str, Tuple["torch.cuda.Event", float]] = {}
        self.groups: Dict[str, _Group] = {}
        self.began: Optional[float] = None
        self.ended: Optional[float] = None
        self.process_started = process_start_time()
        self.wall_clock_offset = time.time() - self.clock()  # this clock + offset = time.time()
        self.marks: Dict[str, float] = {}  # first frame read, first frame encoded, first packet written
        self.facts: Dict[str, object] = {}  # what ran: threads, presets, devices
        self.waits: Dict[str, float] = {}  # seconds a thread waited: encode for frames, encode for the GPU, ...
        self.process_cpu_start: Optional[float] = None
        self.process_cpu = None

    # ---- recording ----

    def _add(self, stage: str, device: str, start: float, end: float, frames: int) -> None:
        with self._lock:
            key = (stage, device)
            if key not in self._intervals:
                self._intervals[key] = _Intervals()
            self._intervals[key].add(start, end, frames)

    @contextlib.contextmanager
    def host(self, stage: str, frames: int = 1, device: str = "") -> Iterator[None]:
        """A block of host work of ``stage`` (the calling thread's clock)."""
        start = self.clock()
        try:
            yield
        finally:
            self._add(stage, device, start, self.clock(), frames)

    def add_host(self, stage: str, start: float, frames: int = 1, device: str = "") -> None:
        """Host work of ``stage`` from ``start`` (this profile's clock) until now."""
        self._add(stage, device, start, self.clock(), frames)

    def wait(self, what: str, start: float) -> None:
        """A thread waited from ``start`` until now (for frames, for the GPU...)."""
        with self._lock:
            self.waits[what] = self.waits.get(what, 0.0) + self.clock() - start

    def mark(self, what: str) -> None:
        """Notes the first time something happened (e.g. "first packet written")."""
        if what not in self.marks:
            self.marks[what] = self.clock()

    @contextlib.contextmanager
    def device(self, stage: str, device: torch.device, stream=None, frames: int = 1) -> Iterator[None]:
        """A block of work queued on ``stream`` of ``device`` (CUDA: the current stream by default),
        timed by events recorded around it; on the CPU the work is done in the block: host time."""
        device = torch.device(device)
        if device.type != "cuda":
            with self.host(stage, frames, str(device)):
                yield
            return
        stream = stream if stream is not None else torch.cuda.current_stream(device)
        begin = torch.cuda.Event(enable_timing=True)
        begin.record(stream)
        try:
            yield
        finally:
            end = torch.cuda.Event(enable_timing=True)
            end.record(stream)
            with self._lock:
                self._pending.append((stage, str(device), begin, end, frames))
                harvest = len(self._pending) >= 2 * _HARVEST_EVERY
            if harvest:
                self._harvest(wait=False)

    def reference(self, device: torch.device) -> None:
        """The clock of a CUDA device against this profile's: an event recorded on an idle device
        (call before the device's work starts)."""
        device = torch.device(device)
        if device.type != "cuda" or str(device) in self._references:
            return
        torch.cuda.synchronize(device)
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(device))
        event.synchronize()
        self._references[str(device)] = (event, self.clock())

    def _harvest(self, wait: bool) -> None:
        """Turns the device spans whose events are done into intervals (all of them with ``wait``)."""
        with self._lock:
            pending, self._pending = self._pending, []
        keep = []
        for index, (stage, device, begin, end, frames) in enumerate(pending):
            if not wait and (index >= len(pending) - _HARVEST_EVERY or not end.query()):
                keep.append((stage, device, begin, end, frames))
                continue
            if wait:
                end.synchronize()
            reference, at = self._references[device]
            start = at + reference.elapsed_time(begin) / 1e3
            self._add(stage, device, start, at + reference.elapsed_time(end) / 1e3, frames)
        if keep:
            with self._lock:
                self._pending = keep + self._pending

    # ---- threads ----

    @contextlib.contextmanager
    def threads_of(self, group: str) -> Iterator[None]:
        """Threads started inside the block (e.g. by opening a codec) count as ``group``'s. Call it
        where no other thread starts threads meanwhile."""
        before = _thread_ids()
        yield
        self.groups.setdefault(group, _Group()).tids |= _thread_ids() - before

    def join_group(self, group: str) -> None:
        """The calling thread's CPU time counts as ``group``'s."""
        self.groups.setdefault(group, _Group()).tids.add(threading.get_native_id())

    def group_start(self, group: str) -> None:
        g = self.groups.setdefault(group, _Group())
        g.start = _thread_times(g.tids)

    def group_end(self, group: str) -> None:
        """Reads the group's CPU time now (before its threads end: an encoder's end with its file)."""
        g = self.groups.get(group)
        if g is not None and g.end is None:
            g.end = _thread_times(g.tids)

    # ---- the run ----

    def begin(self) -> None:
        """The run starts (the threads start): the wall time and the CPU times are counted from here."""
        self.began = self.clock()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.process_cpu_start = usage.ru_utime + usage.ru_stime
        for group in self.groups:
            self.group_start(group)

    def finish(self) -> None:
        """The run ended (the last packet is written): reads the device spans and the CPU times."""
        if self.ended is not None:
            return
        self.ended = self.clock()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        if self.process_cpu_start is not None:
            self.process_cpu = usage.ru_utime + usage.ru_stime - self.process_cpu_start
        for group in self.groups:
            self.group_end(group)
        self._harvest(wait=True)

    @property
    def wall(self) -> float:
        if self.began is None:
            return 0.0
        return (self.ended if self.ended is not None else self.clock()) - self.began

    # ---- the report ----

    def spans(self, stage: str, device: Optional[str] = None) -> List[Tuple[float, float]]:
        """The merged busy intervals of ``stage`` (on ``device``, else on any)."""
        merged = _Intervals()
        for (name, dev), intervals in self._intervals.items():
            if name == stage and (device is None or dev == device):
                merged.starts.extend(intervals.starts)
                merged.ends.extend(intervals.ends)
        return merged.merged()

    def frames(self, stage: str, device: Optional[str] = None) -> int:
        return sum(iv.frames for (name, dev), iv in self._intervals.items()
                   if name == stage and (device is None or dev == device))

    def devices(self) -> List[str]:
        return sorted({dev for (name, dev) in self._intervals if name in DEVICE_STAGES and dev})

    def _cores(self, group: str) -> Optional[float]:
        g = self.groups.get(group)
        if g is None or g.start is None or g.end is None or self.wall <= 0 or not g.tids:
            return None
        return max(0.0, g.end[0] - g.start[0]) / self.wall

    def run_queue_wait(self, group: str) -> Optional[float]:
        """Seconds the group's threads were runnable but waited for a core (Linux schedstat)."""
        g = self.groups.get(group)
        if g is None or g.start is None or g.end is None:
            return None
        return max(0.0, g.end[1] - g.start[1])

    def rows(self) -> List[StageRow]:
        wall = self.wall or 1e-9
        rows = []
        devices = self.devices()
        for stage in STAGES:
            where = devices if stage in DEVICE_STAGES and len(devices) > 1 else [None]
            for device in where:
                spans = self.spans(stage, device)
                seconds = _length(spans)
                name = STAGE_NAMES[stage] + (f" ({device})" if device else "")
                cores = None
                if stage == "decode":
                    cores = self._cores("decode")
                elif stage == "encode":
                    cores = self._cores("encode")
                note = "in the encode thread" if stage == "mux" else ""
                rows.append(StageRow(stage, name, seconds, self.frames(stage, device), seconds / wall, cores, note))
        return rows

    def overlap_with_network(self, stage: str) -> Optional[float]:
        """The share of the network's busy time during which ``stage`` was busy too."""
        network = self.spans("network")
        total = _length(network)
        if total <= 0:
            return None
        return _intersection(self.spans(stage), network) / total

    def bound(self) -> Optional[StageRow]:
        """The stage busy the largest share of the run; encode and mux count together (one thread: the
        row returned is the encode stage's with their joint busy time)."""
        best = None
        for row in self.rows():
            if row.stage == "mux":
                continue
            if row.stage == "encode":
                seconds = _length(_merge(self.spans("encode") + self.spans("mux")))
                row = StageRow(row.stage, row.name, seconds, row.frames, seconds / (self.wall or 1e-9),
                               row.cpu_cores, row.note)
            if best is None or row.busy > best.busy:
                best = row
        return best

    def startup(self) -> Dict[str, Optional[float]]:
        """Seconds from the process's start to the marks (first frame read, encoded, written)."""
        out: Dict[str, Optional[float]] = {}
        for what, at in self.marks.items():
            wall = at + self.wall_clock_offset
            out[what] = None if self.process_started is None else wall - self.process_started
        return out

    def summary(self) -> dict:
        """Everything as plain data (for --profile-json and the benchmarks)."""
        rows = self.rows()
        bound = self.bound()
        process_cores = None if self.process_cpu is None or self.wall <= 0 else self.process_cpu / self.wall
        return {
            "wall_s": self.wall,
            "rows": [{"stage": r.stage, "name": r.name, "seconds": r.seconds, "frames": r.frames,
                      "frames_per_s": r.rate, "busy": r.busy, "cpu_cores": r.cpu_cores, "note": r.note}
                     for r in rows],
            "bound": bound.name if bound else None,
            "overlap_with_network": {s: self.overlap_with_network(s) for s in ("decode", "encode")},
            "cpu_cores": {"process": process_cores, **{g: self._cores(g) for g in self.groups}},
            "run_queue_wait_s": {g: self.run_queue_wait(g) for g in self.groups},
            "waits_s": dict(self.waits),
            "startup_s": self.startup(),
            "marks_wall_time": {k: v + self.wall_clock_offset for k, v in self.marks.items()},
            "process_started": self.process_started,
            "facts": dict(self.facts),
        }

    def table(self) -> str:
        """The profile as a markdown table with a few lines under it."""
        summary = self.summary()
        lines = ["| stage | time (s) | frames | frames/s | busy | CPU cores |",
                 "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for row in summary["rows"]:
            rate = "-" if row["frames_per_s"] is None else f"{row['frames_per_s']:.1f}"
            cores = row["note"] or ("-" if row["cpu_cores"] is None else f"{row['cpu_cores']:.2f}")
            lines.append(f"| {row['name']} | {row['seconds']:.2f} | {row['frames']} | {rate} | "
                         f"{100 * row['busy']:.0f}% | {cores} |")
        cores = summary["cpu_cores"]
        extra = [f"wall {summary['wall_s']:.2f} s; bound: {summary['bound']}"]
        if cores.get("process") is not None:
            extra.append(f"CPU cores busy: {cores['process']:.2f} in all" +
                         (f", {cores['main']:.2f} in the main thread (queues the device work)"
                          if cores.get("main") is not None else ""))
        overlap = summary["overlap_with_network"]
        if overlap["decode"] is not None:
            extra.append(f"while the network ran, decode was busy {100 * overlap['decode']:.0f}% and encode "
                         f"{100 * (overlap['encode'] or 0):.0f}% of the time")
        if summary["waits_s"]:
            extra.append("waits: " + ", ".join(f"{k} {v:.2f} s" for k, v in sorted(summary["waits_s"].items())))
        queued = {g: w for g, w in summary["run_queue_wait_s"].items() if w}
        if queued:
            extra.append("waiting for a free core: " + ", ".join(f"{g} threads {w:.2f} s" for g, w in queued.items()))
        startup = {k: v for k, v in summary["startup_s"].items() if v is not None}
        if startup:
            extra.append("from the process's start: " + ", ".join(f"{k} {v:.2f} s" for k, v in startup.items()))
        return "\n".join(lines + [""] + extra)


def _merge(spans: List[Tuple[float, float]]) -> List[Tuple[float, float]]:
    merged = _Intervals()
    for a, b in spans:
        merged.add(a, b, 0)
    return merged.merged()
