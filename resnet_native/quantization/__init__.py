"""resnet_native.quantization: the arithmetic and calibration of INT8 and FP8 inference, on the host.

    int8              symmetric per-tensor / per-channel int8 quantisation ([-127, 127], round half to even), the
                      requantisation of a conv with folded BatchNorm: the float formula and the kernel's fp32
                      per-channel multiplier alpha[k] = s_x * s_w[k] / s_y
    fp8               FP8 E4M3FN codes (bias 7, max 448, one NaN, no infinities), round to nearest even, saturating;
                      per-tensor / per-channel scales amax / 448
    scales            the max-abs scales both share
    calibration       activation range observers: max-abs, percentile, entropy (TensorRT's minimum KL), bounded memory
    simulate          fake-quant float64 forward of an inference plan, calibrate(state, images, method)
    calibration_file  Calibration and its JSON file (schema-checked load, atomic save)
    selection         the observer method chosen by held-out accuracy on the training set (release --int8 / --fp8;
                      CIFAR10Classifier(dtype='int8') simulates the release's calibration on the host)

The GPU half: resnet_native.quantized_conv (cuDNN graph-API int8 / FP8 convolutions) and
InferenceEngine(dtype='int8' | 'fp8', calibration=...) (inference/quantized.py), on this arithmetic.
"""

from .calibration import EntropyObserver, MaxAbsObserver, PercentileObserver, make_observer
from .calibration_file import Calibration, load_calibration, save_calibration
from .fp8 import E4M3_MAX, decode_e4m3, dequantize_fp8, encode_e4m3, fp8_scale, quantize_fp8
from .int8 import INT8_MAX, dequantize_int8, int8_scale, quantize_int8, requant_params, requantize, requantize_float
from .selection import choose_calibration, choose_calibrations
from .simulate import calibrate, calibrate_many, float_logits, simulate_logits, value_names

__all__ = [
    "Calibration",
    "E4M3_MAX",
    "EntropyObserver",
    "INT8_MAX",
    "MaxAbsObserver",
    "PercentileObserver",
    "calibrate",
    "calibrate_many",
    "choose_calibration",
    "choose_calibrations",
    "decode_e4m3",
    "dequantize_fp8",
    "dequantize_int8",
    "encode_e4m3",
    "float_logits",
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
    "simulate_logits",
    "value_names",
]
