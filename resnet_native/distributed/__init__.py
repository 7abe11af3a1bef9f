"""Data-parallel training over NCCL: one process per GPU.

- world.py     the process's place in the job (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; mpirun, Slurm)
- store.py     rendezvous over TCP (rank 0 hosts a small key-value store), barriers, the NCCL unique id exchange
- sharding.py  each rank's disjoint, equal-sized share of an epoch's shuffled images
- buckets.py   which gradients are all-reduced together, and where each lies in its bucket's flat buffer
- launch.py    `python -m resnet_native.train --nproc N`: N local processes, one failure stops them all
- rank.py      one rank's start: its GPU (LOCAL_RANK), NCCL's settings, the rendezvous

- allreduce.py  the gradient all-reduce TrainStep calls (GradientAllReduce): StoreAllReduce (NumPy, through the
               Store; CPU tests), NcclAllReduce (cupy.cuda.nccl over the buckets, captured in the step's graph)

training.loop.Trainer(world=..., store=...) trains data-parallel (shards, per-rank batch, the step with the
all-reduce, eager or captured, rank 0 writes); the command line (training/cli.py) runs it for any World a launcher sets.
"""

from .buckets import bucket_offsets, plan_buckets
from .launch import launch
from .sharding import shard_indices
from .store import Store, exchange_nccl_id, rendezvous
from .world import World, world_from_launcher_env

__all__ = ["Store", "World", "bucket_offsets", "exchange_nccl_id", "launch", "plan_buckets", "rendezvous",
           "shard_indices", "world_from_launcher_env"]
