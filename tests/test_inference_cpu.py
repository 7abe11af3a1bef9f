"""The inference engine's calls, without a GPU: batch chunking, input checks, model sources, and the argument
validation of InferenceEngine and normalize_u8 (everything is checked before any device access). The plan, its
buffers and its run on the NumPy references are in test_inference_plan_cpu.py."""

import numpy as np
import pytest
import yaml
from fake_arrays import KDL_CPU, FakeCudaArray, FakeDLPackArray, fake

import resnet_native as rn
from resnet_native.inference import InferenceEngine, model_source, normalize_u8
from resnet_native.inference.engine import batch_chunks
from resnet_native.inference.input_stage import CAST, COPY, NORMALIZE, InputStage

# ------------------------------------------------------------------------------------------------------------
# Calls: chunks and input checks


def test_batches_are_padded_to_a_captured_size_or_split():
    sizes = (4, 8)
    assert batch_chunks(0, sizes, True) == []
    assert batch_chunks(3, sizes, False) == [(0, 3, 4)]
    assert batch_chunks(4, sizes, False) == [(0, 4, 4)]
    assert batch_chunks(5, sizes, False) == [(0, 5, 8)]
    assert batch_chunks(8, sizes, False) == [(0, 8, 8)]
    assert batch_chunks(19, sizes, True) == [(0, 8, 8), (8, 8, 8), (16, 3, 4)]
    assert batch_chunks(21, sizes, True) == [(0, 8, 8), (8, 8, 8), (16, 5, 8)]
    with pytest.raises(ValueError, match=r"batch of 9 is over the largest captured batch size 8 and split=False"):
        batch_chunks(9, sizes, False)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_input_stage_accepts_pixels_and_batches_and_names_what_is_wrong(layout):
    stage = InputStage("bf16", layout, (32, 24), lut=None)
    sample = (32, 24, 3) if layout == "NHWC" else (3, 32, 24)
    assert stage.sample_shape == sample
    assert stage.kind_of(np.zeros((2, 32, 24, 3), np.uint8)) == NORMALIZE  # pixels are HWC in any layout
    assert stage.kind_of(np.zeros((2, *sample), np.uint16)) == COPY
    assert stage.kind_of(np.zeros((2, *sample), np.float16)) == CAST
    assert stage.kind_of(np.zeros((2, *sample), np.float32)) == CAST
    with pytest.raises(ValueError, match=r"x: uint8 images must be \(N, 32, 24, 3\)"):
        stage.kind_of(np.zeros((2, 3, 32, 24), np.uint8))
    with pytest.raises(TypeError, match="x: expected uint8 images or a float32"):
        stage.kind_of(np.zeros((2, *sample), np.int32))
    with pytest.raises(ValueError, match=rf"x: expected a {layout} batch of shape"):
        stage.kind_of(np.zeros((2, 32, 32, 3), np.float32))


def test_inputs_that_are_no_device_arrays_are_named():
    pytest.importorskip("cupy")
    from resnet_native.inference.input_stage import as_device_array

    with pytest.raises(TypeError, match="images: expected a cupy array, any __cuda_array_interface__ or DLPack"):
        as_device_array([[0, 1]], "images")
    host = FakeDLPackArray((2, 3), device=(KDL_CPU, 0))
    with pytest.raises(TypeError, match="x: expected a CUDA array, got a .*FakeDLPackArray in host memory"):
        as_device_array(host)
    assert host.calls == [], "an array in host memory was read"


# ------------------------------------------------------------------------------------------------------------
# Argument validation (before any device access)


def _release_folder(tmp_path, model):
    folder = tmp_path / "version_T"
    folder.mkdir()
    config = {"version": "T", "model": {"name": "resnet18", "num_classes": model.num_classes, "stem": model.stem,
                                        "layout": "NHWC", "dtype": "fp16"},
              "input": {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    np.savez(folder / "model.npz", **model.state_dict())
    return folder


def test_model_source_reads_a_model_or_a_release(tmp_path):
    model = rn.ResNet18(num_classes=6, stem="imagenet", seed=3)
    from_model = model_source(model)
    assert (from_model.stem, from_model.num_classes) == ("imagenet", 6)
    folder = _release_folder(tmp_path, model)
    for release in (folder, str(folder), "T"):
        source = model_source(release, models_dir=tmp_path)
        assert (source.stem, source.num_classes) == ("imagenet", 6)
        assert sorted(source.state) == sorted(from_model.state)
        np.testing.assert_array_equal(source.state["layer4.1.conv2.weight"], from_model.state["layer4.1.conv2.weight"])
    with pytest.raises(FileNotFoundError, match="version 'Z'"):
        model_source("Z", models_dir=tmp_path)
    with pytest.raises(TypeError, match="model_or_release: expected a resnet_native ResNet"):
        model_source(3.5)


def _expect_device_stage():
    if rn.cuda_available():
        pytest.skip("a GPU is present: the engine builds (tests/test_inference_gpu.py)")
    return pytest.raises(rn.NoGPUError)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_sizes": ()}, ValueError, "batch_sizes: expected a non-empty"),
        ({"batch_sizes": (1, 0)}, ValueError, "batch_sizes"),
        ({"batch_sizes": (1, True)}, TypeError, r"batch_sizes\[1\]: expected an int >= 1, got True"),
        ({"batch_sizes": None}, TypeError, "batch_sizes"),
        ({"dtype": "int4"}, ValueError, "precision: expected one of"),
        ({"precision": "int8", "layout": "NCHW"}, ValueError, "layout: the int8 engine runs NHWC"),
        ({"precision": "fp8"}, ValueError, "calibration: a fp8 engine of a model needs calibration="),
        ({"precision": "fp16", "calibration": object()}, ValueError, "calibration: only int8 / fp8 engines"),
        ({"precision": "float16"}, ValueError, "precision: expected one of"),
        ({"layout": "NWHC"}, ValueError, "layout: expected one of"),
        ({"split": 1}, TypeError, "split: expected True or False"),
        ({"cuda_graph": "yes"}, TypeError, "cuda_graph"),
        ({"tune_fusion": None}, TypeError, "tune_fusion"),
        ({"deterministic": 0}, TypeError, "deterministic"),
        ({"conv_engine": "cudnn"}, ValueError, "conv_engine: expected one of"),
        ({"algorithm_cache": 5}, TypeError, "algorithm_cache: expected a file path"),
        ({"image_size": 0}, ValueError, "image_size"),
        ({"quantized_kernels": "fast"}, ValueError, "quantized_kernels: expected one of"),
        ({"quantized_kernels": "own"}, ValueError, r"quantized_kernels: only int8 engines .*precision='fp16'"),
    ],
)
def test_engine_validates_its_arguments_first(kwargs, error, match):
    with pytest.raises(error, match=match):
        InferenceEngine(rn.ResNet18(num_classes=10, seed=0), **kwargs)


def test_engine_with_valid_arguments_gets_to_the_device(tmp_path):
    model = rn.ResNet18(num_classes=10, seed=0)
    with pytest.raises(TypeError, match="model_or_release"):
        InferenceEngine(object())
    with _expect_device_stage():
        InferenceEngine(model, batch_sizes=(8, 1, 8), precision="bf16", layout="NCHW")
    with _expect_device_stage():
        InferenceEngine(_release_folder(tmp_path, model), precision="tf32", algorithm_cache=tmp_path / "algos.json")


def test_normalize_u8_validates_images_table_and_output():
    images = fake((2, 4, 5, 3), "uint8", ptr=0x100000)
    lut = fake((3, 256), "float16", ptr=0x200000)
    out = fake((2, 4, 5, 3), "float16", ptr=0x300000)
    with pytest.raises(TypeError, match="images: expected a CUDA array"):
        normalize_u8(np.zeros((2, 4, 5, 3), np.uint8), lut, out, layout="NHWC", dtype="fp16")
    with pytest.raises(TypeError, match="images: expected a uint8 array, got float16"):
        normalize_u8(fake((2, 4, 5, 3), "float16", ptr=0x100000), lut, out, layout="NHWC", dtype="fp16")
    with pytest.raises(ValueError, match=r"images: expected \(N, H, W, 3\)"):
        normalize_u8(fake((2, 3, 4, 5), "uint8", ptr=0x100000), lut, out, layout="NHWC", dtype="fp16")
    strided = FakeCudaArray((2, 4, 5, 3), "uint8", strides=(120, 30, 6, 2), ptr=0x100000)
    with pytest.raises(ValueError, match="images: expected a C-contiguous array"):
        normalize_u8(strided, lut, out, layout="NHWC", dtype="fp16")
    with pytest.raises(ValueError, match=r"lut: expected shape \(3, 256\)"):
        normalize_u8(images, fake((256, 3), "float16", ptr=0x200000), out, layout="NHWC", dtype="fp16")
    with pytest.raises(TypeError, match="lut: expected a bfloat16 array"):
        normalize_u8(images, lut, fake((2, 4, 5, 3), "uint16", ptr=0x300000), layout="NHWC", dtype="bf16")
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 3, 4, 5\)"):
        normalize_u8(images, lut, out, layout="NCHW", dtype="fp16")
    with pytest.raises(ValueError, match="layout"):
        normalize_u8(images, lut, out, layout="HWC", dtype="fp16")
    with pytest.raises(ValueError, match="out must not share memory with images"):
        normalize_u8(images, lut, fake((2, 4, 5, 3), "float16", ptr=0x100010), layout="NHWC", dtype="fp16")
    with pytest.raises(ValueError, match="out must not share memory with lut"):
        normalize_u8(images, lut, fake((2, 4, 5, 3), "float16", ptr=0x200100), layout="NHWC", dtype="fp16")
    with pytest.raises(rn.NoGPUError if not rn.cuda_available() else TypeError):
        normalize_u8(images, lut, out, layout="NHWC", dtype="fp16")
    lut32 = fake((3, 256), "float32", ptr=0x200000)
    with pytest.raises(rn.NoGPUError if not rn.cuda_available() else TypeError):
        normalize_u8(images, lut32, fake((2, 3, 4, 5), "float32", ptr=0x300000), layout="NCHW", dtype="fp32")

