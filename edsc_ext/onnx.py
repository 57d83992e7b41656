"""``edsc_ext.onnx``, the export's first name (``import edsc_ext.onnx``): the very module
:mod:`edsc_ext.models.onnx`, under both names."""

import sys

from .models import onnx

sys.modules[__name__] = onnx
