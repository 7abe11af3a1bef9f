"""The process's World from torchrun's variables, and from mpirun's and Slurm's (resnet_native.distributed.world)."""

import pytest

from resnet_native.distributed import World, world_from_launcher_env

TORCHRUN = {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "29501"}


def test_no_variables_is_a_single_process():
    world = World.from_env({})
    assert world == World(0, 1, 0, "127.0.0.1", 29500) and world.is_primary
    assert world_from_launcher_env({"PATH": "/bin"}) == world


def test_torchrun_variables():
    world = World.from_env(TORCHRUN)
    assert (world.rank, world.world_size, world.local_rank, world.master_addr, world.master_port) == \
        (2, 4, 0, "10.0.0.7", 29501)
    assert not world.is_primary and world.address == "10.0.0.7:29501"
    assert World.from_env(dict(TORCHRUN, LOCAL_WORLD_SIZE="2", LOCAL_RANK="1")).local_rank == 1
    with pytest.raises(AttributeError):
        world.rank = 0  # frozen


@pytest.mark.parametrize("change, message", [
    ({"RANK": "two"}, "RANK='two': expected an integer"),
    ({"RANK": "-1"}, "RANK=-1: expected an integer between 0"),
    ({"RANK": "4"}, "RANK=4: expected a rank below WORLD_SIZE=4"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0: expected an integer between 1"),
    ({"WORLD_SIZE": "1.5"}, "WORLD_SIZE='1.5'"),
    ({"LOCAL_RANK": "4"}, "LOCAL_RANK=4: expected a rank below WORLD_SIZE=4"),
    ({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=2: expected a rank below LOCAL_WORLD_SIZE=2"),
    ({"LOCAL_WORLD_SIZE": "5"}, "LOCAL_WORLD_SIZE=5: expected an integer between 1 and 4"),
    ({"MASTER_PORT": "0"}, "MASTER_PORT=0: expected an integer between 1 and 65535"),
    ({"MASTER_PORT": "65536"}, "MASTER_PORT=65536"),
    ({"MASTER_PORT": "http"}, "MASTER_PORT='http'"),
    ({"MASTER_ADDR": ""}, "MASTER_ADDR=''"),
    ({"MASTER_ADDR": "a b"}, "MASTER_ADDR='a b'"),
])
def test_malformed_values_name_the_variable(change, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        World.from_env(dict(TORCHRUN, **change))


def test_a_partial_set_names_the_missing_variables():
    env = {k: v for k, v in TORCHRUN.items() if k not in ("MASTER_ADDR", "LOCAL_RANK")}
    with pytest.raises(ValueError, match="LOCAL_RANK, MASTER_ADDR: not set, but RANK, WORLD_SIZE, MASTER_PORT are"):
        World.from_env(env)


def test_direct_construction_is_checked():
    with pytest.raises(ValueError, match="rank: expected a number of ranks"):
        World(rank=3, world_size=3)
    with pytest.raises(TypeError, match="world_size"):
        World(world_size="2")
    with pytest.raises(ValueError, match="master_port"):
        World(master_port=70000)
    with pytest.raises(ValueError, match="master_addr"):
        World(master_addr="")


def test_mpirun_and_slurm_variables():
    ompi = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "3",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    assert world_from_launcher_env(ompi) == World(3, 4, 3, "127.0.0.1", 29500)  # one host: loopback
    many_hosts = dict(ompi, OMPI_COMM_WORLD_LOCAL_SIZE="2", OMPI_COMM_WORLD_LOCAL_RANK="1")
    with pytest.raises(ValueError, match="MASTER_ADDR: not set; a mpirun job over several hosts"):
        world_from_launcher_env(many_hosts)
    assert world_from_launcher_env(dict(many_hosts, MASTER_ADDR="node0", MASTER_PORT="1234")) == \
        World(3, 4, 1, "node0", 1234)
    slurm = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_NNODES": "1",
             "SLURM_NTASKS_PER_NODE": "2(x1)"}
    assert world_from_launcher_env(slurm) == World(1, 2, 1, "127.0.0.1", 29500)
    with pytest.raises(ValueError, match="SLURM_PROCID=2: expected a rank below SLURM_NTASKS=2"):
        world_from_launcher_env(dict(slurm, SLURM_PROCID="2"))
    with pytest.raises(ValueError, match="SLURM_LOCALID: not set, but SLURM_PROCID is"):
        world_from_launcher_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"})


def test_torchrun_variables_win():
    env = dict(TORCHRUN, SLURM_PROCID="0", SLURM_NTASKS="8", SLURM_LOCALID="0", OMPI_COMM_WORLD_RANK="1")
    assert world_from_launcher_env(env) == World.from_env(TORCHRUN)
    with pytest.raises(ValueError, match="not set, but RANK"):  # a partial torchrun set is not filled in
        world_from_launcher_env({"RANK": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"})
