"""Data-parallel training over NCCL: the parts that need no GPU.

- world.py     the process's place in the job (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; mpirun, Slurm)
- store.py     rendezvous over TCP (rank 0 hosts a small key-value store), barriers, the NCCL unique id exchange
- sharding.py  each rank's disjoint, equal-sized share of an epoch's shuffled images
- buckets.py   which gradients are all-reduced together, and where each lies in its bucket's flat buffer
- launch.py    `python -m resnet_native.train --nproc N`: N local processes, one failure stops them all

- allreduce.py  the gradient all-reduce TrainStep calls (GradientAllReduce): StoreAllReduce (NumPy, through the
               Store; CPU tests), NcclAllReduce (cupy.cuda.nccl over the buckets; not yet run on a GPU)

training.loop.Trainer(world=..., store=...) trains data-parallel (shards, per-rank batch, eager step with the
all-reduce, rank 0 writes); the command line still refuses WORLD_SIZE > 1 until the NCCL path is verified.
"""

from .buckets import bucket_offsets, plan_buckets
from .launch import launch
from .sharding import shard_indices
from .store import Store, exchange_nccl_id, rendezvous
from .world import World, world_from_launcher_env

__all__ = ["Store", "World", "bucket_offsets", "exchange_nccl_id", "launch", "plan_buckets", "rendezvous",
           "shard_indices", "world_from_launcher_env"]
