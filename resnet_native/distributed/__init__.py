"""Data-parallel training over NCCL: one process per GPU.

world (the process's place in the job from the launcher's variables: torchrun-style, mpirun, Slurm), store (TCP
rendezvous, barriers, the NCCL id exchange), sharding (each rank's disjoint, equal share of an epoch), buckets
(which gradients are all-reduced together), launch (`python -m resnet_native.train --nproc N`: local processes,
one failure stops them all), rank (one rank's start), allreduce (the GradientAllReduce TrainStep calls: Store on
the host for CPU tests, NCCL on the GPU, capturable in the step's graph) and overlap (its overlap with backward).
training.loop.Trainer(world=..., store=...) trains data-parallel; training/cli.py runs it for any World a
launcher sets.
"""

from .buckets import bucket_offsets, plan_buckets
from .launch import launch
from .sharding import shard_indices
from .store import Store, exchange_nccl_id, rendezvous
from .world import World, world_from_launcher_env

__all__ = ["Store", "World", "bucket_offsets", "exchange_nccl_id", "launch", "plan_buckets", "rendezvous",
           "shard_indices", "world_from_launcher_env"]
