"""HostSnapshot on host arrays (the values a later write cannot reach, buffer reuse, errors) and the algorithm
cache file that is rewritten only when the choices change."""

import numpy as np
import pytest

import resnet_native as rn
from resnet_native.nn.models.registry import create_model
from resnet_native.training.checkpoint_writer import AlgorithmCacheFile
from resnet_native.training.snapshot import HostSnapshot


def _sources(arrays):
    return {k: (a, np.asarray) for k, a in arrays.items()}


def test_a_snapshot_holds_the_values_at_take_in_memory_of_its_own():
    rng = np.random.default_rng(0)
    model = {"w": rng.standard_normal((3, 4)).astype(np.float32), "n": np.array(7, np.int64)}
    opt = {"m.0": rng.standard_normal(5).astype(np.float32), "empty": np.zeros((0, 3), np.float32)}
    expected = {g: {k: a.copy() for k, a in d.items()} for g, d in (("model", model), ("opt", opt))}
    snaps = HostSnapshot()
    pending = snaps.take({"model": _sources(model), "opt": _sources(opt)})
    model["w"] += 1  # written after take: the snapshot keeps the old values
    out = pending.resolve()
    assert out.keys() == expected.keys()
    for g in expected:
        assert out[g].keys() == expected[g].keys()
        for k, v in expected[g].items():
            assert out[g][k].dtype == v.dtype and out[g][k].shape == v.shape
            np.testing.assert_array_equal(out[g][k], v)
    second = snaps.take({"model": _sources(model), "opt": _sources(opt)}).resolve()
    np.testing.assert_array_equal(second["model"]["w"], expected["model"]["w"] + 1)
    np.testing.assert_array_equal(out["model"]["w"], expected["model"]["w"])  # not a view of the reused buffer


def test_to_host_converts_on_resolve():
    w = np.arange(24, dtype=np.float32).reshape(2, 3, 4, 1)
    pending = HostSnapshot().take({"m": {"w": (w, lambda a: np.ascontiguousarray(a.transpose(0, 3, 1, 2)))}})
    out = pending.resolve()["m"]["w"]
    assert out.shape == (2, 1, 3, 4) and out.flags.c_contiguous
    np.testing.assert_array_equal(out, w.transpose(0, 3, 1, 2))


def test_a_snapshot_resolves_once():
    pending = HostSnapshot().take({"m": {"w": (np.ones(3, np.float32), np.asarray)}})
    pending.resolve()
    with pytest.raises(RuntimeError, match="already resolved"):
        pending.resolve()
    pending.release()  # harmless


def test_state_dict_is_the_state_sources_copied():
    model = create_model("resnet18", layout="NHWC", precision="fp32", seed=0).to_host(np.float32)
    snap = HostSnapshot().take({"model": model.state_sources()}).resolve()["model"]
    ref = model.state_dict()
    assert list(snap) == list(ref)
    for k in ref:
        assert snap[k].dtype == ref[k].dtype and snap[k].shape == ref[k].shape, k
        np.testing.assert_array_equal(snap[k], ref[k])
    assert ref["conv1.weight"].shape == (64, 3, 3, 3)  # torch's layout from an NHWC model


def test_the_algorithm_cache_file_is_written_only_when_the_choices_change(tmp_path, monkeypatch):
    entries, writes = [{"key": "b", "algo": 1}, {"key": "a", "algo": 0}], []
    monkeypatch.setattr(rn.conv, "algorithm_cache_entries", lambda: [dict(e) for e in entries])
    monkeypatch.setattr(rn.conv, "save_algorithm_cache",
                        lambda path: writes.append(path) or path.write_text("{}"))
    f = AlgorithmCacheFile(tmp_path / "algos.json")
    f.save()
    entries.reverse()  # the same choices in another order (least recently used first): nothing to write
    f.save()
    assert writes == [tmp_path / "algos.json"]
    entries[0]["algo"] = 5
    f.save()
    (tmp_path / "algos.json").unlink()  # removed behind its back: written again
    f.save()
    assert len(writes) == 3


def test_the_transfer_copies_device_runs_and_never_a_host_entry(monkeypatch):
    """_device_runs: consecutive device entries make one copy; a host entry between them splits it."""
    from resnet_native.training import snapshot

    monkeypatch.setattr(snapshot, "_is_device", lambda a: a.dtype == np.float32)  # float32 plays the device
    arrays = [np.zeros(5, np.float32), np.zeros(3, np.float32), np.zeros(2, np.int64), np.zeros(7, np.float32),
              np.zeros(1, np.int64)]
    entries = [("g", str(i), a, np.asarray) for i, a in enumerate(arrays)]
    layout, nbytes = snapshot._layout(entries)
    offsets = [offset for offset, _, _ in layout]
    runs = snapshot._device_runs(entries, layout)
    assert runs == [(offsets[0], offsets[1] + 12), (offsets[3], offsets[3] + 28)]
    for start, stop in runs:  # no host entry's bytes inside a run
        assert not any(start <= offsets[i] < stop for i in (2, 4))
