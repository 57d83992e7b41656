"""The EDSC networks (Cheng & Chen, TPAMI 2021) on top of :mod:`edsc_ext`, checkpoint-compatible.

``EDSC(kernel_size=5, multiple=False)`` is EDSC_s (the midpoint between two frames);
``multiple=True`` is EDSC_m, which interpolates at any time ``t`` in (0, 1). Their ``state_dict``
keys and shapes are those of the released checkpoints (which hold it under ``'model_state'``), so
:func:`load_checkpoint` reads them directly.

Conventions of the original (the released weights expect them): frames are (N, 3, H, W) in [0, 1],
BGR channel order (OpenCV's), H and W multiples of 32 (:meth:`EDSC.interpolate` pads and crops
for you).

``sampling="compat"`` (the default) reproduces the original layer exactly (taps one pixel up-left of
centred, border pixels counted twice past the frame; see :mod:`edsc_ext.compat`): use it with the
released weights. ``sampling="clean"`` uses :func:`edsc_ext.deform_sepconv` with centred taps and
plain replicate padding, for networks trained with this package.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .compat import compat_deform_sepconv
from .ops import deform_sepconv

__all__ = ["HetConv2d", "EDSC", "EDSC_s", "EDSC_m", "load_checkpoint", "save_checkpoint", "state_dict_of",
           "pad_to_multiple", "SAMPLINGS", "MODEL_NAMES"]

SAMPLINGS = ("compat", "clean")
MODEL_NAMES = ("EDSC_s", "EDSC_m")
# Five 2x average poolings down to the bottleneck.
SIZE_MULTIPLE = 32


class HetConv2d(nn.Module):
    """The "efficient heterogeneous" convolution of EDSC: a grouped KxK convolution with ``p`` groups,
    plus a 1x1 convolution, minus a grouped 1x1 convolution (which the 1x1 already contains)."""

    def __init__(self, in_channels: int, out_channels: int, p: int = 4, kernel_size: int = 3, padding: int = 1):
        super().__init__()
        if in_channels % p or out_channels % p:
            raise ValueError(f"in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible "
                             f"by p={p}")
        # The attribute names are the checkpoints' keys.
        self.conv3x3 = nn.Conv2d(in_channels, out_channels, kernel_size, padding=padding, groups=p)
        self.conv1x1_ = nn.Conv2d(in_channels, out_channels, 1, groups=p)
        self.conv1x1 = nn.Conv2d(in_channels, out_channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv3x3(x) + self.conv1x1(x) - self.conv1x1_(x)


def _upsample() -> nn.Module:
    return nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)


def _stage(in_channels: int, out_channels: int, p: int) -> nn.Sequential:
    return nn.Sequential(HetConv2d(in_channels, out_channels, p), nn.ReLU(),
                         HetConv2d(out_channels, out_channels, p), nn.ReLU(),
                         HetConv2d(out_channels, out_channels, p), nn.ReLU())


def _head(in_channels: int, out_channels: int, sigmoid: bool = False) -> nn.Sequential:
    layers = [nn.Conv2d(in_channels, 64, 3, padding=1), nn.ReLU(),
              nn.Conv2d(64, 32, 3, padding=1), nn.ReLU(),
              nn.Conv2d(32, out_channels, 3, padding=1), nn.ReLU(),
              _upsample(),
              nn.Conv2d(out_channels, out_channels, 3, padding=1)]
    if sigmoid:
        layers.append(nn.Sigmoid())
    return nn.Sequential(*layers)


class EDSC(nn.Module):
    """EDSC: a U-Net over both frames predicts, per frame, per-pixel separable kernels, deformation
    offsets and a mask; the output is the sum of the two adaptively convolved frames plus a
    predicted residual.

    Args:
        kernel_size: K, taps per axis of the adaptive kernels (5 in the paper).
        multiple: False for EDSC_s (midpoint only), True for EDSC_m (any time t in (0, 1)).
        sampling: "compat" (the original layer, for released weights) or "clean" (centred taps).
        het_p: groups of the heterogeneous convolutions.
        use_bias: add the predicted residual (the original's default).
    """

    def __init__(self, kernel_size: int = 5, multiple: bool = False, sampling: str = "compat", het_p: int = 4,
                 use_bias: bool = True):
        super().__init__()
        if sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {SAMPLINGS}, got {sampling!r}")
        if kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd and positive, got {kernel_size}")
        self.kernel_size = kernel_size
        self.multiple = multiple
        self.sampling = sampling
        self.use_bias = use_bias
        k, p = kernel_size, het_p
        head_in = 65 if multiple else 64

        # Registration order is the checkpoints' key order.
        self.moduleConv1 = nn.Sequential(nn.Conv2d(6, 32, 3, padding=1), nn.ReLU(),
                                         HetConv2d(32, 32, p), nn.ReLU(),
                                         HetConv2d(32, 32, p), nn.ReLU())
        self.moduleConv2 = _stage(32, 64, p)
        self.moduleConv3 = _stage(64, 128, p)
        self.moduleConv4 = _stage(128, 256, p)
        self.moduleConv5 = _stage(256, 512, p)
        self.moduleDeconv5 = _stage(512, 512, p)
        self.moduleDeconv4 = _stage(512, 256, p)
        self.moduleDeconv3 = _stage(256, 128, p)
        self.moduleDeconv2 = _stage(128, 64, p)
        for name, channels in (("moduleUpsample5", 512), ("moduleUpsample4", 256), ("moduleUpsample3", 128),
                               ("moduleUpsample2", 64)):
            self.add_module(name, nn.Sequential(_upsample(), HetConv2d(channels, channels, p), nn.ReLU()))
        self.moduleVertical1 = _head(head_in, k)
        self.moduleVertical2 = _head(head_in, k)
        self.moduleHorizontal1 = _head(head_in, k)
        self.moduleHorizontal2 = _head(head_in, k)
        self.moduleOffset1x = _head(head_in, k * k)
        self.moduleOffset1y = _head(head_in, k * k)
        self.moduleOffset2x = _head(head_in, k * k)
        self.moduleOffset2y = _head(head_in, k * k)
        self.moduleMask1 = _head(head_in, k * k, sigmoid=True)
        self.moduleMask2 = _head(head_in, k * k, sigmoid=True)
        self.moduleBias = _head(64, 3)

    @property
    def name(self) -> str:
        return "EDSC_m" if self.multiple else "EDSC_s"

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, multiple={self.multiple}, sampling={self.sampling!r}"

    def features(self, first: Tensor, second: Tensor) -> Tensor:
        """The U-Net: the 64-channel half-resolution feature the heads read."""
        conv1 = self.moduleConv1(torch.cat([first, second], 1))
        conv2 = self.moduleConv2(F.avg_pool2d(conv1, 2))
        conv3 = self.moduleConv3(F.avg_pool2d(conv2, 2))
        conv4 = self.moduleConv4(F.avg_pool2d(conv3, 2))
        conv5 = self.moduleConv5(F.avg_pool2d(conv4, 2))
        deconv5 = self.moduleUpsample5(self.moduleDeconv5(F.avg_pool2d(conv5, 2)))
        deconv4 = self.moduleUpsample4(self.moduleDeconv4(deconv5 + conv5))
        deconv3 = self.moduleUpsample3(self.moduleDeconv3(deconv4 + conv4))
        deconv2 = self.moduleUpsample2(self.moduleDeconv2(deconv3 + conv3))
        return deconv2 + conv2

    def synthesize(self, frame: Tensor, vertical: Tensor, horizontal: Tensor, offset_x: Tensor,
                   offset_y: Tensor, mask: Tensor) -> Tensor:
        """Adaptive convolution of one (unpadded) frame with the heads' outputs, in the frame's dtype
        (under autocast the heads run in half precision; the sampling stays in the frame's)."""
        dtype = frame.dtype
        vertical, horizontal, offset_x, offset_y, mask = (
            t.to(dtype) for t in (vertical, horizontal, offset_x, offset_y, mask))
        pad = self.kernel_size // 2
        if self.sampling == "compat":
            # Identical to FunctionDSepconv on the replicate-padded frame, without the padded copy.
            return compat_deform_sepconv(frame, vertical, horizontal, offset_x, offset_y, mask, padding=pad)
        n, taps, h, w = mask.shape
        offset = torch.stack((offset_x, offset_y), dim=2).reshape(n, 2 * taps, h, w)
        return deform_sepconv(frame, vertical, horizontal, offset, mask, padding=pad, padding_mode="border")

    def _time_map(self, time, feature: Tensor) -> Tensor:
        n, _, h, w = feature.shape
        if time is None:
            time = 0.5
        t = torch.as_tensor(time, dtype=feature.dtype, device=feature.device)
        if t.dim() == 4 and t.shape[1:] == (1, h, w):
            return t.expand(n, 1, h, w)
        if t.numel() not in (1, n):
            raise ValueError(f"time must be a float, or one value per batch element ({n}), got shape "
                             f"{tuple(t.shape)}")
        return t.reshape(-1, 1, 1, 1).expand(n, 1, h, w)

    def forward(self, first: Tensor, second: Tensor, time: Union[float, Tensor, None] = None) -> Tensor:
        """Interpolates between ``first`` and ``second`` (N, 3, H, W), H and W multiples of 32.

        ``time`` (EDSC_m only): a float, or a tensor with one value per batch element, in (0, 1);
        default 0.5. Returns the (unclamped) interpolated frame, (N, 3, H, W).
        """
        if first.shape != second.shape or first.dim() != 4:
            raise ValueError(f"first and second must be (N, C, H, W) of one shape, got {tuple(first.shape)} and "
                             f"{tuple(second.shape)}")
        h, w = first.shape[2:]
        if h % SIZE_MULTIPLE or w % SIZE_MULTIPLE:
            raise ValueError(f"frame height and width must be multiples of {SIZE_MULTIPLE}, got {h}x{w} "
                             f"(use EDSC.interpolate or pad_to_multiple)")
        combine = self.features(first, second)
        if self.multiple:
            t = self._time_map(time, combine)
            in1, in2 = torch.cat([combine, t], 1), torch.cat([combine, 1 - t], 1)
        else:
            if time is not None and not (isinstance(time, (int, float)) and time == 0.5):
                raise ValueError("EDSC_s interpolates the midpoint only; use EDSC(multiple=True) (EDSC_m) for "
                                 "other times")
            in1 = in2 = combine
        dot1 = self.synthesize(first, self.moduleVertical1(in1), self.moduleHorizontal1(in1),
                               self.moduleOffset1x(in1), self.moduleOffset1y(in1), self.moduleMask1(in1))
        dot2 = self.synthesize(second, self.moduleVertical2(in2), self.moduleHorizontal2(in2),
                               self.moduleOffset2x(in2), self.moduleOffset2y(in2), self.moduleMask2(in2))
        out = dot1 + dot2
        if self.use_bias:
            out = out + self.moduleBias(combine).to(out.dtype)
        return out

    @torch.no_grad()
    def interpolate(self, first: Tensor, second: Tensor, time: Union[float, Tensor, None] = None) -> Tensor:
        """Inference on frames of any size, (3, H, W) or (N, 3, H, W) in the model's channel order
        (BGR for the released weights): replicate-pads to a multiple of 32, runs the network,
        crops back and clamps to [0, 1]."""
        single = first.dim() == 3
        if single:
            first, second = first.unsqueeze(0), second.unsqueeze(0)
        (first, second), (h, w) = pad_to_multiple((first, second), SIZE_MULTIPLE)
        out = self(first, second, time)[..., :h, :w].clamp(0, 1)
        return out[0] if single else out


def EDSC_s(**kwargs) -> EDSC:  # noqa: N802 (the paper's name)
    """EDSC_s: midpoint interpolation (``EDSC(multiple=False)``)."""
    return EDSC(multiple=False, **kwargs)


def EDSC_m(**kwargs) -> EDSC:  # noqa: N802
    """EDSC_m: interpolation at any time t in (0, 1) (``EDSC(multiple=True)``)."""
    return EDSC(multiple=True, **kwargs)


def pad_to_multiple(frames, multiple: int = SIZE_MULTIPLE) -> Tuple[tuple, Tuple[int, int]]:
    """Replicate-pads (N, C, H, W) frames at the bottom and right to multiples of ``multiple``;
    returns the padded frames and the original (H, W)."""
    h, w = frames[0].shape[-2:]
    ph, pw = (-h) % multiple, (-w) % multiple
    if ph or pw:
        frames = tuple(F.pad(f, (0, pw, 0, ph), mode="replicate") for f in frames)
    return tuple(frames), (h, w)


# --------------------------------------------------------------------------------------------
# Checkpoints: {'model_state': state_dict, ...}, as released with the original code.


def state_dict_of(model: nn.Module) -> "OrderedDict[str, Tensor]":
    """The model's state dict with the wrappers' prefixes removed (DistributedDataParallel's
    ``module.``, torch.compile's ``_orig_mod.``), i.e. with the original's keys."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    model = getattr(model, "_orig_mod", model)
    return model.state_dict()


def save_checkpoint(model: nn.Module, path, **extra) -> None:
    """Saves ``{'model_state': state_dict, **extra}``, the released checkpoints' format."""
    state = OrderedDict((k, v.detach().cpu()) for k, v in state_dict_of(model).items())
    torch.save({"model_state": state, **extra}, path)


def _strip_prefixes(state: dict) -> dict:
    out = OrderedDict()
    for key, value in state.items():
        for prefix in ("module.", "_orig_mod."):
            while key.startswith(prefix):
                key = key[len(prefix):]
        out[key] = value
    return out


def load_checkpoint(checkpoint, model: Optional[EDSC] = None, *, map_location="cpu", sampling: str = "compat",
                    strict: bool = True) -> EDSC:
    """Loads an EDSC checkpoint (a path, or an already loaded dict) into ``model``, or into a new
    EDSC whose variant (EDSC_s/EDSC_m) and kernel size are read off the weights.

    Accepts the released format (``{'model_state': ...}``), a bare state dict, and keys prefixed by
    ``module.`` (DistributedDataParallel) or ``_orig_mod.`` (torch.compile). Loads with
    ``weights_only=True``: tensors and plain containers only, no arbitrary pickled objects.
    """
    if isinstance(checkpoint, (str, os.PathLike)):
        checkpoint = torch.load(checkpoint, map_location=map_location, weights_only=True)
    if not isinstance(checkpoint, dict):
        raise TypeError(f"expected a checkpoint dict, got {type(checkpoint).__name__}")
    state = checkpoint.get("model_state", checkpoint)
    for key in ("state_dict", "model"):
        if key in state and isinstance(state[key], dict):
            state = state[key]
    state = _strip_prefixes(state)
    if model is None:
        try:
            head = state["moduleVertical1.0.weight"]
            kernel = state["moduleVertical1.7.weight"]
        except KeyError as e:
            raise ValueError(f"not an EDSC checkpoint: no {e.args[0]!r} in its state") from None
        model = EDSC(kernel_size=kernel.shape[0], multiple=head.shape[1] == 65, sampling=sampling)
    model.load_state_dict(state, strict=strict)
    return model
