"""resnet_native.quantization: the arithmetic and calibration of INT8 and FP8 inference, on the host.

int8 (symmetric [-127, 127] codes and the requantisation of a conv with folded BatchNorm), fp8 (E4M3FN codes,
max 448, saturating), scales (the max-abs scales both share), calibration (range observers: max-abs, percentile,
entropy), calibration_file (Calibration and its JSON file), prefix (quantize_from: where an engine's 8-bit part
begins). Plain NumPy and low in the layers, so the ops and the engine build on it; what runs a model on it lives
above: the float64 simulation and the calibration choice (inference.simulate, inference.calibration_choice), the
8-bit convolutions (ops.quantized_conv) and InferenceEngine(precision='int8' | 'fp8') (inference/quantized.py).
"""

from .calibration import EntropyObserver, MaxAbsObserver, PercentileObserver, make_observer
from .calibration_file import Calibration, load_calibration, save_calibration
from .fp8 import E4M3_MAX, decode_e4m3, dequantize_fp8, encode_e4m3, fp8_scale, quantize_fp8
from .int8 import INT8_MAX, dequantize_int8, int8_scale, quantize_int8, requant_params, requantize, requantize_float

__all__ = [
    "Calibration",
    "E4M3_MAX",
    "EntropyObserver",
    "INT8_MAX",
    "MaxAbsObserver",
    "PercentileObserver",
    "decode_e4m3",
    "dequantize_fp8",
    "dequantize_int8",
    "encode_e4m3",
    "fp8_scale",
    "int8_scale",
    "load_calibration",
    "make_observer",
    "quantize_fp8",
    "quantize_int8",
    "requant_params",
    "requantize",
    "requantize_float",
    "save_calibration",
]
