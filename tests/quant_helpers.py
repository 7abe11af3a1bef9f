"""A tiny random ResNet-18 state_dict (torchvision names, CIFAR stem, widths 8-16-32-64) for the quantisation
tests: the plan reads every shape from the state, so narrow layers run the same graph in a fraction of the time."""

import numpy as np

WIDTHS = (8, 16, 32, 64)


def _conv(rng, k, c, r):
    return (rng.standard_normal((k, c, r, r)) * np.sqrt(2.0 / (c * r * r))).astype(np.float32)


def _bn(state, rng, prefix, c):
    state[f"{prefix}.weight"] = rng.uniform(0.5, 1.5, c).astype(np.float32)
    state[f"{prefix}.bias"] = rng.uniform(-0.3, 0.3, c).astype(np.float32)
    state[f"{prefix}.running_mean"] = rng.uniform(-0.5, 0.5, c).astype(np.float32)
    state[f"{prefix}.running_var"] = rng.uniform(0.5, 2.0, c).astype(np.float32)


def tiny_resnet18_state(seed: int = 0, num_classes: int = 10) -> dict:
    rng = np.random.default_rng(seed)
    state = {"conv1.weight": _conv(rng, WIDTHS[0], 3, 3)}
    _bn(state, rng, "bn1", WIDTHS[0])
    c = WIDTHS[0]
    for stage, k in enumerate(WIDTHS, start=1):
        for block in range(2):
            p = f"layer{stage}.{block}"
            state[f"{p}.conv1.weight"] = _conv(rng, k, c, 3)
            _bn(state, rng, f"{p}.bn1", k)
            state[f"{p}.conv2.weight"] = _conv(rng, k, k, 3)
            _bn(state, rng, f"{p}.bn2", k)
            if block == 0 and (stage > 1 or c != k):
                state[f"{p}.downsample.0.weight"] = _conv(rng, k, c, 1)
                _bn(state, rng, f"{p}.downsample.1", k)
            c = k
    state["fc.weight"] = (rng.standard_normal((num_classes, c)) / np.sqrt(c)).astype(np.float32)
    state["fc.bias"] = rng.uniform(-0.1, 0.1, num_classes).astype(np.float32)
    return state


def assert_fp32_simulation_agrees(got: np.ndarray, want: np.ndarray, what) -> None:
    """The fp32 fake-quant logits `got` against the float64 ones `want`, image by image. An activation within fp32
    rounding of a rounding boundary takes the neighbouring code; in a network this narrow one such flip moves its
    image's logits by ~1e-3..2e-2 (as much as quantisation itself moves them), while an image without one
    agrees to fp32 rounding (~1e-7). A wrong scale or rounding in the fp32 path moves every image, so: at least 3
    images in 4 agree to 1e-5."""
    err = np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)
    assert np.mean(err < 1e-5) >= 0.75, (what, err)
