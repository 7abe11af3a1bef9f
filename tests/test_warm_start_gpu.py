"""prime_first_steps on the GPU: after it, the run's own first training steps and evaluation forwards search for
no algorithm (every search was the throwaway model's), the partial batches' convolutions took heuristic choices
(no search), and the memory it used is given back."""

import gc

import cupy
import pytest
from algorithm_modes import modes_by_batch

from resnet_native.data.augment import storage_dtype
from resnet_native.ops import conv
from resnet_native.optim.step import TrainStep
from resnet_native.training.builders import build_model, build_optimizer, build_scaler, partial_batch_search
from resnet_native.training.config import TrainConfig, load_recipe
from resnet_native.training.warm_start import batch_shapes, prime_first_steps

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_the_runs_first_steps_search_nothing_after_priming(precision):
    cfg = TrainConfig.from_dict({**load_recipe("B"), "batch_size": 96, "eval_batch_size": 300, "subset": 1000,
                                 "precision": precision})
    conv.clear_algorithm_cache()
    gc.collect()
    used = cupy.get_default_memory_pool().used_bytes()
    prime_first_steps(cfg)
    assert cupy.get_default_memory_pool().used_bytes() == used  # the throwaway's memory is given back
    searched = conv.algorithm_cache_stats()["finds"]
    assert searched > 0
    model = build_model(cfg)
    step = TrainStep(model, build_optimizer(cfg, model), label_smoothing=cfg.label_smoothing,
                     scaler=build_scaler(cfg), cuda_graph=True)
    dtype = storage_dtype(precision)
    assert batch_shapes(1000, cfg.batch_size) == (96, 40) and batch_shapes(10_000, cfg.eval_batch_size) == (300, 100)
    for b in batch_shapes(1000, cfg.batch_size):
        for _ in range(2):  # the first call of a shape runs eagerly, the second captures it
            with partial_batch_search(b, cfg.batch_size):  # as the trainer runs them
                step.run(cupy.zeros((b, 32, 32, 3), dtype=dtype), cupy.zeros((b,), dtype=cupy.int32))
    assert step.num_graphs == 2
    model.eval()
    for b in batch_shapes(10_000, cfg.eval_batch_size):
        with partial_batch_search(b, cfg.eval_batch_size):
            model.forward(cupy.zeros((b, 32, 32, 3), dtype=dtype), train=False, copy=False)
    cupy.cuda.get_current_stream().synchronize()
    assert conv.algorithm_cache_stats()["finds"] == searched
    modes = modes_by_batch()
    assert modes == {96: {"find"}, 40: {"heuristic"}, 300: {"find"}, 100: {"heuristic"}}, modes
