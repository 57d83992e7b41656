"""Module form of the op, for use inside networks."""

from typing import Optional, Tuple, Union

from torch import Tensor, nn

from .ops import IntPair, check_geometry, deform_sepconv


class DeformSepConv2d(nn.Module):
    """Applies :func:`edsc_ext.deform_sepconv` with fixed geometry. The per-pixel kernels, offsets
    and mask are forward arguments: a network predicts them, they are not parameters."""

    def __init__(self, kernel_size: Optional[IntPair] = None, padding: IntPair = 0, dilation: IntPair = 1,
                 padding_mode: str = "zeros"):
        super().__init__()
        check_geometry(kernel_size, padding, dilation, padding_mode)  # fail at construction, not first call
        self.kernel_size = kernel_size
        self.padding = padding
        self.dilation = dilation
        self.padding_mode = padding_mode

    def forward(self, input: Tensor, vertical: Optional[Tensor] = None, horizontal: Optional[Tensor] = None,
                offset: Union[None, Tensor, Tuple[Tensor, Tensor]] = None, mask: Optional[Tensor] = None) -> Tensor:
        """:func:`edsc_ext.deform_sepconv` of these tensors with the module's kernel size, padding, dilation
        and padding mode; absent tensors cost nothing.

        Args:
            input: (N, C, H_in, W_in) frame or feature map.
            vertical: (N, KH, H_out, W_out) per-pixel vertical kernels (absent: ones).
            horizontal: (N, KW, H_out, W_out) per-pixel horizontal kernels (absent: ones).
            offset: (N, 2*KH*KW, H_out, W_out), (dy, dx) per tap (absent: zeros); or a pair ``(dy, dx)``
                of (N, KH*KW, H_out, W_out) tensors (split offsets), read where they are.
            mask: (N, KH*KW, H_out, W_out) per-tap modulation (absent: ones).

        Returns:
            (N, C, H_out, W_out) of the input's dtype, channels_last where the input is.
        """
        return deform_sepconv(input, vertical, horizontal, offset, mask, kernel_size=self.kernel_size,
                              padding=self.padding, dilation=self.dilation, padding_mode=self.padding_mode)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, padding={self.padding}, dilation={self.dilation}, "
                f"padding_mode={self.padding_mode!r}")
