"""Checkpoints with one-line errors, and the inference engine of ``edsc-interpolate``.

:class:`Interpolator` takes jobs "the frame at time t between frames a and b" (RGB float tensors,
(3, H, W) in [0, 1]) and returns the new frames:

- **batches**: up to ``batch`` new frames per network call (EDSC_m takes one t per batch element);
- **EDSC_s** only computes midpoints, so a time t = k / 2^L is reached by bisection (midpoints of
  midpoints; shared midpoints are computed once). Other times need EDSC_m: :func:`check_times`
  says so before any work;
- **tiles** (``tile=SIZE``): the frame is cut into overlapping SIZE x SIZE cores; each core is run
  with a ``margin`` of context on every side (cut away afterwards), its start aligned to the 32-pixel
  grid of the network's five 2x poolings, so that the tile sees what the whole frame would have
  shown it. Neighbouring cores overlap by ``overlap`` pixels, where their outputs are blended with
  linear weights that sum to one, so no seam shows. The margin covers the kernels' reach (K//2
  pixels plus the offsets) and the part of the U-Net's receptive field that matters in practice: its
  theoretical reach is a few hundred pixels (3x3 convolutions down to 1/32 resolution), but its
  influence falls off fast (with 32 pixels of margin a tile differs from the whole frame by < 1e-4
  for a random network; the default margin is 64);
- **CUDA out of memory** on a whole frame switches to tiles (halving their size until they fit);
- **fast paths** (CUDA): ``half`` runs the network under autocast in float16 (or ``"bf16"``:
  bfloat16) with the model and frames in channels_last (the fastest variant of
  ``edsc-model-benchmark``; the sampling stays float32); ``cuda_graph`` replays the
  network as a CUDA graph (:meth:`EDSC.capture`), one per frame size, partial batches padded to the
  captured batch; ``compile`` runs it through ``torch.compile``, and where graphs would be used
  (CUDA, whole frames) in mode "reduce-overhead": the compiled network replayed as CUDA graphs, the
  fastest path (``edsc-model-benchmark``, variant compiledgraph). Where one is
  unavailable (no CUDA, no Triton, a failing compile or capture) the engine says so in one line and
  runs without it.
"""

from __future__ import annotations

import re
import warnings
from contextlib import nullcontext
from fractions import Fraction
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..models import EDSC, SIZE_MULTIPLE, CheckpointError, load_checkpoint
from .common import UserError, describe_os_error, note

__all__ = ["load_model", "default_device", "Interpolator", "check_times", "is_dyadic", "tile_spans",
           "DEFAULT_MARGIN", "DEFAULT_OVERLAP", "MAX_BISECTION_DEPTH", "HALF_TYPES", "has_triton"]

DEFAULT_MARGIN = 64
DEFAULT_OVERLAP = 32
# EDSC_s reaches t = k / 2^L by L levels of midpoints; deeper than this is not worth it.
MAX_BISECTION_DEPTH = 8
# --half's types.
HALF_TYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def has_triton() -> bool:
    """Whether torch.compile's GPU backend (Inductor, through Triton) can run here."""
    try:
        from torch.utils._triton import has_triton as torch_has_triton
    except ImportError:  # an older torch
        return False
    return bool(torch_has_triton())


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_model(weights, model_name: Optional[str] = None, sampling: str = "compat", device="cpu") -> EDSC:
    """An EDSC network in eval mode on ``device`` with the checkpoint's weights. Any checkpoint that
    is not an EDSC one (missing, a folder, text, a bare tensor, a foreign pickle, truncated, other
    keys) is a :class:`UserError` naming the file, with :func:`load_checkpoint`'s words for what is
    wrong; so is ``model_name`` ("EDSC_s"/"EDSC_m") not matching the weights."""
    path = Path(weights)
    what = f"--weights {path}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notes on pickle protocols of foreign files
            model = load_checkpoint(path, sampling=sampling)
    except OSError as e:
        raise UserError(f"{what}: {describe_os_error(e, path).split(': ', 1)[-1]}") from None
    except CheckpointError as e:
        raise UserError(f"{what}: {e.problem}") from None
    except Exception as e:  # noqa: BLE001 (other keys or shapes)
        raise UserError(f"{what}: not an EDSC checkpoint ({_checkpoint_problem(e)})") from None
    if model_name is not None and model.name != model_name:
        raise ValueError(f"--model {model_name} but the weights in {weights} are those of {model.name}")
    # The tools' weights never change after loading: keep the fused weights instead of making them per call.
    model.cache_weights = True
    return model.to(device).eval()


_SIZE_MISMATCH = re.compile(r"size mismatch for (\S+): copying a param with shape torch\.Size\(\[(.*?)\]\) from "
                            r"checkpoint, the shape in current model is torch\.Size\(\[(.*?)\]\)")


def _checkpoint_problem(error: Exception) -> str:
    """What is wrong with a checkpoint's tensors, in a few words naming the first wrong key (the
    first line of load_state_dict's message is only its heading)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    if not lines[0].startswith("Error(s) in loading state_dict"):
        return lines[0][:160]
    problems = lines[1:] or ["its tensors do not fit the network"]
    found = _SIZE_MISMATCH.match(problems[0])
    first = (f"{found[1]} has shape ({found[2]}), the network's is ({found[3]})" if found
             else problems[0].replace(" in state_dict", "").rstrip(". "))
    if len(first) > 160:
        first = first[:157] + "..."
    return first + (f"; and {len(problems) - 1} more problem(s)" if len(problems) > 1 else "")


def is_dyadic(t, max_depth: int = MAX_BISECTION_DEPTH) -> bool:
    """Whether t (a Fraction, or a float) is k / 2^L with L <= max_depth, i.e. reachable by EDSC_s."""
    f = Fraction(t).limit_denominator(1 << 20)
    return f.denominator & (f.denominator - 1) == 0 and f.denominator <= (1 << max_depth)


def check_times(model: EDSC, times: Iterable, what: str = "") -> None:
    """Raises a UserError if EDSC_s cannot make a frame at one of ``times`` (only EDSC_m can)."""
    if model.multiple:
        return
    for t in times:
        if not is_dyadic(t):
            raise UserError(f"EDSC_s only interpolates midpoints (t = 1/2, 1/4, 3/4, ...){what}, but a frame is "
                            f"needed at t = {float(t):.4g}: use EDSC_m weights")


def tile_spans(length: int, tile: int, overlap: int) -> List[Tuple[int, int]]:
    """The [start, end) cores along one axis: ``tile`` long, overlapping by at least ``overlap``,
    covering [0, length); starts on the 32-pixel grid where possible (the last core ends at length)."""
    if length <= tile:
        return [(0, length)]
    stride = max(SIZE_MULTIPLE, (tile - overlap) // SIZE_MULTIPLE * SIZE_MULTIPLE)
    spans = []
    start = 0
    while start + tile < length:
        spans.append((start, start + tile))
        start += stride
    spans.append((length - tile, length))
    return spans


def _axis_weights(spans: List[Tuple[int, int]], length: int) -> List[Tensor]:
    """Per core, 1D blending weights over its span: 1 inside, linear ramps down towards its edges
    over the overlaps with its neighbours (towards 0 at an edge inside the frame, so the blend is
    continuous: no seam). Where only two neighbours overlap the weights sum to 1; the caller
    divides by the sum anyway (the last core may overlap more than its neighbour)."""
    weights = []
    for j, (start, end) in enumerate(spans):
        w = torch.ones(end - start, dtype=torch.float64)
        if j > 0:  # overlap with the previous core: [start, previous end)
            width = spans[j - 1][1] - start
            ramp = (torch.arange(width, dtype=torch.float64) + 0.5) / width
            w[:width] = torch.minimum(w[:width], ramp)
        if j + 1 < len(spans):  # overlap with the next core: [next start, end)
            width = end - spans[j + 1][0]
            ramp = 1 - (torch.arange(width, dtype=torch.float64) + 0.5) / width
            w[end - start - width:] = torch.minimum(w[end - start - width:], ramp)
        weights.append(w)
    return weights


class Interpolator:
    """Runs an EDSC network on jobs (first, second, t), as the module's docstring describes.

    ``half``: False, True or "fp16" (float16), "bf16" (bfloat16); ``cuda_graph``: None (on CUDA
    with whole frames and without ``compile``), True or False. ``half`` on CUDA puts the model in
    channels_last (its values are unchanged). :attr:`paths` says what ran: "graph", "compiled",
    "eager", with the precision."""

    def __init__(self, model: EDSC, batch: int = 1, tile: Optional[int] = None, margin: int = DEFAULT_MARGIN,
                 overlap: int = DEFAULT_OVERLAP, half=False, compile: bool = False,
                 cuda_graph: Optional[bool] = None, quiet: bool = False):
        self.model = model
        self.device = next(model.parameters()).device
        if batch < 1:
            raise UserError(f"--batch must be >= 1, got {batch}")
        if tile is not None and tile < 2 * SIZE_MULTIPLE:
            raise UserError(f"--tile must be at least {2 * SIZE_MULTIPLE} pixels, got {tile}")
        if margin < 0 or overlap < 0:
            raise UserError("the tile margin and overlap cannot be negative")
        if half is True:
            half = "fp16"
        if half and half not in HALF_TYPES:
            raise UserError(f"--half {half}: expected one of {', '.join(HALF_TYPES)}")
        self.batch, self.tile, self.margin, self.quiet = batch, tile, margin, quiet
        self.overlap = min(overlap, tile // 2) if tile else overlap
        self.tiles_used = 0
        cuda = self.device.type == "cuda"
        self.autocast_dtype = None
        if half and not cuda:
            self._note(f"--half runs the network in {half} under CUDA autocast; on {self.device} it runs in float32")
        elif half:
            self.autocast_dtype = HALF_TYPES[half]
        self.memory_format = torch.channels_last if self.autocast_dtype is not None else torch.contiguous_format
        if self.autocast_dtype is not None:
            model.to(memory_format=torch.channels_last)
        self._net = self._autocast_forward  # the network under the precision's autocast; compiled below
        self.compiled = False
        self._graph_wanted = cuda_graph is not False
        # Compiled, the graphs are inductor's (mode "reduce-overhead"), one per frame size as well.
        self.compiled_graphs = bool(compile and cuda and tile is None and self._graph_wanted)
        if compile and cuda and not has_triton():
            self._note("--compile needs Triton for CUDA (pip install triton): running the network uncompiled")
            self.compiled_graphs = False
        elif compile:
            self._net = torch.compile(self._autocast_forward, mode="reduce-overhead" if self.compiled_graphs else None)
            self.compiled = True
        if cuda_graph and not cuda:
            self._note(f"--cuda-graph needs a CUDA device (this run uses {self.device}): running without it")
        elif cuda_graph and tile is not None:
            self._note("--cuda-graph takes whole frames, not --tile: running the tiles without graphs")
        self.use_graph = bool(cuda and not self.compiled and tile is None and self._graph_wanted)
        self._graphs: Dict[tuple, object] = {}
        self.paths: Dict[str, int] = {}  # what ran, and how often ("graph fp16", "eager fp32", ...)

    def _note(self, message: str) -> None:
        note(f"edsc-interpolate: {message}", self.quiet)

    @property
    def precision(self) -> str:
        return {None: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[self.autocast_dtype]

    def _count(self, path: str) -> None:
        key = f"{path} {self.precision}"
        self.paths[key] = self.paths.get(key, 0) + 1

    # ---- the network on model-ready tensors (N, 3, H, W), BGR, on the device ----

    def _autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast("cuda", dtype=self.autocast_dtype)

    def _autocast_forward(self, first: Tensor, second: Tensor, times: Optional[Tensor]) -> Tensor:
        """The network under this engine's autocast, entered inside: what ``compile`` compiles, so that
        the dtype is part of the traced graph (entered outside, torch's compile caches could hand a
        graph compiled for float16 to a bfloat16 run, pytorch/pytorch#181564)."""
        with self._autocast():
            return self.model(first, second, times)

    def _graph_of(self, first: Tensor, second: Tensor, times: Optional[Tensor]):
        """The CUDA graph of the network on frames of this shape (captured on first use), or None
        where capture failed (said once; the network then runs eagerly)."""
        key = (tuple(first.shape), None if times is None else tuple(times.shape))
        if key not in self._graphs:
            try:
                with torch.cuda.device(self.device):  # the capture's synchronisation and caches: this GPU's
                    self._graphs[key] = self.model.capture(first, second, times, autocast_dtype=self.autocast_dtype)
            except torch.OutOfMemoryError:
                raise
            except Exception as e:  # noqa: BLE001 (an op that cannot be captured: run eagerly, say so)
                reason = str(e).strip().split("\n")[0][:160]
                self._note(f"CUDA-graph capture failed ({type(e).__name__}: {reason}): running the network eagerly")
                self.use_graph = False
                self._graphs.clear()
                return None
        return self._graphs[key]

    def _forward(self, first: Tensor, second: Tensor, times: Optional[Tensor]) -> Tensor:
        """The network on padded frames (N, 3, H, W): replayed, compiled or eager."""
        times = times if self.model.multiple else None
        first = first.contiguous(memory_format=self.memory_format)
        second = second.contiguous(memory_format=self.memory_format)
        n = first.shape[0]
        if (self.use_graph or self.compiled_graphs) and n < self.batch:
            # One graph per frame size (a compiled one: one compile too): pad a partial batch with its last pair.
            extra = self.batch - n
            first = torch.cat([first, first[-1:].expand(extra, -1, -1, -1)]).contiguous(
                memory_format=self.memory_format)
            second = torch.cat([second, second[-1:].expand(extra, -1, -1, -1)]).contiguous(
                memory_format=self.memory_format)
            times = None if times is None else torch.cat([times, times[-1:].expand(extra)])
        if self.use_graph:
            graph = self._graph_of(first, second, times)
            if graph is not None:
                self._count("graph")
                return graph(first, second, times)[:n]
            first, second = first[:n], second[:n]
            times = None if times is None else times[:n]
        with torch.no_grad():
            if self.compiled:
                try:
                    if self.compiled_graphs:  # a new replay may overwrite the last one's output
                        torch.compiler.cudagraph_mark_step_begin()
                    out = self._net(first, second, times)
                except torch.OutOfMemoryError:
                    raise
                except Exception as e:  # noqa: BLE001 (the compiler's failures: no compiler, an unsupported op)
                    reason = str(e).strip().split("\n")[0][:160]
                    self._note(f"torch.compile failed ({type(e).__name__}: {reason}): running the network "
                               "uncompiled")
                    self._net, self.compiled, self.compiled_graphs = self._autocast_forward, False, False
                    self.use_graph = self.device.type == "cuda" and self.tile is None and self._graph_wanted
                    return self._forward(first[:n], second[:n], None if times is None else times[:n])
                if self.compiled_graphs:
                    self._count("compiled graph")
                    return out[:n].clone()
                self._count("compiled")
                return out
            self._count("eager")
            return self._net(first, second, times)

    def prepare(self, height: int, width: int) -> None:
        """Captures the CUDA graph for frames of this size now (when graphs are in use): a capture
        must not overlap other threads' CUDA calls, so the video path calls this before its decode
        and encode threads start."""
        if not self.use_graph:
            return
        hp, wp = -(-height // SIZE_MULTIPLE) * SIZE_MULTIPLE, -(-width // SIZE_MULTIPLE) * SIZE_MULTIPLE
        frames = torch.full((self.batch, 3, hp, wp), 0.5, device=self.device).contiguous(
            memory_format=self.memory_format)
        times = torch.full((self.batch,), 0.5, device=self.device) if self.model.multiple else None
        try:
            self._graph_of(frames, frames.clone(), times)
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            self._note(f"out of memory capturing the CUDA graph of {self.batch}x{width}x{height}: running the "
                       "network eagerly")
            self.use_graph = False
            self._graphs.clear()

    def _network(self, first: Tensor, second: Tensor, times: Optional[Tensor]) -> Tensor:
        from ..models import pad_to_multiple

        (first, second), (h, w) = pad_to_multiple((first, second), SIZE_MULTIPLE)
        out = self._forward(first, second, times)
        return out[..., :h, :w].float().clamp_(0, 1)

    def _tiled(self, first: Tensor, second: Tensor, times: Optional[Tensor], tile: int) -> Tensor:
        n, c, h, w = first.shape
        rows, cols = tile_spans(h, tile, self.overlap), tile_spans(w, tile, self.overlap)
        row_w, col_w = _axis_weights(rows, h), _axis_weights(cols, w)
        out = torch.zeros(n, c, h, w, device=first.device)
        total = torch.zeros(h, w, dtype=torch.float64)
        for (y0, y1), wy in zip(rows, row_w):
            for (x0, x1), wx in zip(cols, col_w):
                # The context: the margin around the core, its start on the network's 32-pixel grid.
                ry0 = max(0, (y0 - self.margin) // SIZE_MULTIPLE * SIZE_MULTIPLE)
                rx0 = max(0, (x0 - self.margin) // SIZE_MULTIPLE * SIZE_MULTIPLE)
                ry1, rx1 = min(h, y1 + self.margin), min(w, x1 + self.margin)
                part = self._network(first[..., ry0:ry1, rx0:rx1], second[..., ry0:ry1, rx0:rx1], times)
                weight = (wy[:, None] * wx[None, :])
                total[y0:y1, x0:x1] += weight
                out[..., y0:y1, x0:x1] += part[..., y0 - ry0:y1 - ry0, x0 - rx0:x1 - rx0] * weight.to(out)
                self.tiles_used += 1
        return out / total.to(out)

    def run(self, first: Tensor, second: Tensor, times: Optional[Tensor] = None) -> Tensor:
        """The network on a batch of model-ready frames, whole or in tiles (falling back to tiles
        when a whole frame runs out of CUDA memory)."""
        h, w = first.shape[-2:]
        while True:
            tile = self.tile
            try:
                if tile is None or (h <= tile and w <= tile):
                    return self._network(first, second, times)
                return self._tiled(first, second, times, tile)
            except torch.OutOfMemoryError:
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                smaller = _smaller_tile(tile if tile is not None else max(h, w))
                if smaller is None:
                    raise UserError(f"out of memory on {self.device} even with tiles of {tile} pixels "
                                    "(try a smaller --batch)") from None
                note(f"edsc-interpolate: out of memory on {self.device} for {w}x{h} frames"
                     f"{f' in tiles of {tile}' if tile else ''}: using tiles of {smaller} pixels", self.quiet)
                self.tile = smaller
                self.overlap = min(self.overlap, smaller // 2)
                self.use_graph = False  # tiles of several shapes
                self._graphs.clear()

    # ---- jobs on frames (3, H, W) ----

    def _to_model(self, rgb: Tensor) -> Tensor:
        return rgb.to(self.device, non_blocking=True).flip(-3)  # RGB -> the original's BGR

    def _batched(self, pairs: List[Tuple[Tensor, Tensor]], times: List[float]) -> List[Tensor]:
        """Model-space frames for model-space pairs at times, ``batch`` at a time."""
        out: List[Tensor] = []
        for i in range(0, len(pairs), self.batch):
            chunk = pairs[i:i + self.batch]
            first = torch.stack([a for a, _ in chunk])
            second = torch.stack([b for _, b in chunk])
            t = None
            if self.model.multiple:  # a page-locked copy: the host does not wait for the device
                t = torch.tensor(times[i:i + self.batch], dtype=torch.float32)
                t = (t.pin_memory() if first.is_cuda else t).to(first.device, non_blocking=True)
            out.extend(self.run(first, second, t).unbind(0))
        return out

    def interpolate(self, jobs: Sequence[Tuple[Tensor, Tensor, float]]) -> List[Tensor]:
        """For each job (first, second, t), RGB (3, H, W) in [0, 1] (any device), the frame at time t
        in (0, 1): RGB float on the engine's device. EDSC_s needs every t dyadic (k / 2^L)."""
        converted: Dict[int, Tensor] = {}

        def model_frame(x: Tensor) -> Tensor:
            key = id(x)
            if key not in converted:
                converted[key] = self._to_model(x)
            return converted[key]

        frames = self.interpolate_bgr([(model_frame(a), model_frame(b), t) for a, b, t in jobs])
        return [f.flip(-3) for f in frames]

    def interpolate_bgr(self, jobs: Sequence[Tuple[Tensor, Tensor, float]]) -> List[Tensor]:
        """:meth:`interpolate` on frames already in the network's order (BGR) and on its device
        (what the video path converts them to): BGR float frames (3, H, W) in [0, 1]. Jobs
        between the same two tensors share their EDSC_s midpoints."""
        if not jobs:
            return []
        pairs = [(a, b) for a, b, _ in jobs]
        times = [t for _, _, t in jobs]
        if self.model.multiple:
            frames = self._batched(pairs, [float(t) for t in times])
        else:
            check_times(self.model, times)
            frames = self._bisect(pairs, [Fraction(t).limit_denominator(1 << MAX_BISECTION_DEPTH) for t in times])
        return frames

    def _bisect(self, pairs: List[Tuple[Tensor, Tensor]], times: List[Fraction]) -> List[Tensor]:
        """EDSC_s: the frames at dyadic times by levels of midpoints, each level one batched pass;
        a midpoint several jobs need is computed once."""
        known: Dict[Tuple[tuple, Fraction], Tensor] = {}
        keys = [(id(a), id(b)) for a, b in pairs]  # jobs between the same two frames share midpoints
        for key, (a, b) in zip(keys, pairs):
            known[(key, Fraction(0))] = a
            known[(key, Fraction(1))] = b
        for depth in range(1, MAX_BISECTION_DEPTH + 1):
            step = Fraction(1, 1 << depth)
            needed = []  # (pair, midpoint time) at this depth whose interval holds a wanted time
            for key, t in zip(keys, times):
                if (key, t) in known or t.denominator < (1 << depth):
                    continue
                mid = (t // (2 * step)) * 2 * step + step  # the middle of the interval of length 2*step around t
                if (key, mid) not in known and (key, mid) not in needed:
                    needed.append((key, mid))
            if not needed:
                break
            mids = self._batched([(known[(key, m - step)], known[(key, m + step)]) for key, m in needed],
                                 [0.5] * len(needed))
            for entry, frame in zip(needed, mids):
                known[entry] = frame
        return [known[(key, t)] for key, t in zip(keys, times)]


def _smaller_tile(size: int) -> Optional[int]:
    """The next tile size to try after running out of memory at ``size``: a multiple of 32 about
    half as large, no smaller than 128."""
    half = (size // 2) // SIZE_MULTIPLE * SIZE_MULTIPLE
    return half if half >= 128 else None
