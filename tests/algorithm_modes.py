"""What the process's algorithm cache holds, per batch size: the modes ('find', 'heuristic', 'fixed') its
convolutions' choices were made in."""

from resnet_native.ops import conv


def modes_by_batch() -> dict:
    """{batch size (N of the key's input shape): {mode, ...}} over every entry of the algorithm cache."""
    modes = {}
    for entry in conv.algorithm_cache_entries():
        fields = dict(f.split("=", 1) for f in entry["key"].split()[1:])
        modes.setdefault(int(fields["x"].split(",")[0]), set()).add(fields["mode"])
    return modes
