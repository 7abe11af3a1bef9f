"""The training recipe's declarative settings: recipes A and B, command-line overrides, YAML files, and the errors
that name the key (unknown keys, wrong types, out-of-range values), through every way a configuration is made."""

import dataclasses
import pathlib

import pytest

from resnet_native.training import cli
from resnet_native.training.config import RECIPES_DIR, TrainConfig, available_recipes, load_recipe, resume_differences


def cfg_from(argv):
    return cli.resolve_config(cli.build_parser().parse_args(argv))


def test_recipe_a_is_the_issue_recipe():
    cfg = cfg_from(["--recipe", "A"])
    assert cfg.name == "A" and cfg.model == "resnet18" and cfg.epochs == 120
    assert cfg.batch_size == 512 and cfg.precision == "fp16" and cfg.layout == "NHWC"
    assert cfg.optimizer.to_dict() == {"name": "sgd", "lr": 0.3, "momentum": 0.9, "nesterov": True,
                                       "weight_decay": 5e-4, "norm_weight_decay": None}
    assert cfg.schedule.to_dict() == {"name": "cosine", "warmup_epochs": 2.0}
    assert cfg.augment.to_dict() == {"crop_padding": 4, "flip": True, "cutout": 16, "autoaugment": False,
                                      "alternate_flip": False}
    assert cfg.label_smoothing == 0.1 and cfg.eval_every == 10


def test_recipe_b_is_the_issue_recipe():
    cfg = cfg_from(["--recipe", "B"])
    assert cfg.epochs == 90 and cfg.batch_size == 512
    assert cfg.to_dict()["optimizer"] == {"name": "adamw", "lr": 8e-4, "betas": [0.9, 0.999], "eps": 1e-8,
                                          "weight_decay": 0.05, "norm_weight_decay": None}
    assert cfg.schedule.name == "onecycle"
    assert cfg.augment.autoaugment is True and cfg.augment.cutout == 16
    assert cfg.label_smoothing == 0.1 and cfg.eval_every == 10
    assert sorted(available_recipes())[:3] == ["A", "B", "C"]


def test_recipe_c_is_the_fast_recipe():
    """The same network as A, fewer epochs, a linear decay, evaluated once with six-view TTA, on the weights' average;
    A and B keep what they were (no TTA, no average)."""
    cfg = cfg_from(["--recipe", "C"])
    assert cfg.name == "C" and cfg.model == "resnet18" and cfg.epochs < 120 and cfg.engine == "graph"
    assert cfg.optimizer.name == "sgd" and cfg.optimizer.nesterov and cfg.schedule.name == "linear"
    assert cfg.tta == "flip-shift" and cfg.ema.decay > 0 and cfg.eval_every >= cfg.epochs
    assert (cfg.precision, cfg.layout, cfg.augment.autoaugment) == ("fp16", "NHWC", False)
    assert 16 <= cfg.progressive.size < 32 and 0 < cfg.progressive.until < 1  # the early epochs downscaled
    assert cfg.stem.init == "whiten" and not cfg.stem.frozen
    for other in ("A", "B"):
        cfg = cfg_from(["--recipe", other])
        assert cfg.stem.init == "random"
        assert cfg.tta == "none" and cfg.ema.to_dict() == {"decay": 0.0, "every": 1, "start": 0.0}
        assert cfg.progressive.size == 0  # every epoch at full size


def test_the_norm_weight_decay_and_lookahead_flags():
    cfg = cfg_from(["--recipe", "C", "--norm-weight-decay", "0", "--lookahead-decay", "0.77", "--lookahead-every",
                    "4"])
    assert cfg.optimizer.norm_weight_decay == 0.0 and cfg.optimizer.weight_decay == 5e-4
    assert cfg.lookahead.to_dict() == {"decay": 0.77, "every": 4}
    assert cfg_from(["--recipe", "B", "--norm-weight-decay", "1e-3"]).optimizer.norm_weight_decay == 1e-3
    plain = cfg_from(["--recipe", "C"])
    assert plain.optimizer.norm_weight_decay is None and plain.lookahead.decay == 0.0  # off unless asked
    for argv, message in ((["--norm-weight-decay", "-1"], "optimizer.norm_weight_decay: expected >= 0.0"),
                          (["--lookahead-decay", "1"], "lookahead.decay: expected < 1.0"),
                          (["--lookahead-every", "0"], "lookahead.every: expected >= 1")):
        with pytest.raises(ValueError, match=message):
            cfg_from(["--recipe", "C", *argv])
    assert TrainConfig.from_dict({"epochs": 1, "optimizer": {"name": "sgd", "lr": 0.1, "norm_weight_decay": None}}
                                 ).optimizer.norm_weight_decay is None


def test_the_stem_flags():
    cfg = cfg_from(["--recipe", "A", "--stem-init", "whiten", "--stem-frozen"])
    assert cfg.stem.to_dict() == {"init": "whiten", "whiten_eps": 5e-4, "frozen": True}
    plain = cfg_from(["--recipe", "A"])
    assert plain.stem.to_dict() == {"init": "random", "whiten_eps": 5e-4, "frozen": False}  # off unless asked
    assert resume_differences(plain, cfg) == ["stem"]
    assert cfg_from(["--recipe", "C", "--stem-init", "random"]).stem.init == "random"
    for bad, message in (({"init": "pca"}, "stem.init: expected one of"),
                         ({"whiten_eps": 0}, r"stem.whiten_eps: expected > 0.0, got 0.0"),
                         ({"frozen": "yes"}, "stem.frozen: expected true or false")):
        with pytest.raises(ValueError, match=message):
            TrainConfig.from_dict({"epochs": 1, "optimizer": {"lr": 0.1}, "stem": bad})


def test_the_tta_ema_and_schedule_flags():
    cfg = cfg_from(["--recipe", "C", "--tta", "none", "--ema-decay", "0.999", "--ema-every", "2", "--ema-start",
                    "0.25", "--schedule", "onecycle", "--momentum", "0.85", "--crop-padding", "2"])
    assert cfg.tta == "none" and cfg.ema.to_dict() == {"decay": 0.999, "every": 2, "start": 0.25}
    assert cfg.schedule.name == "onecycle" and cfg.optimizer.momentum == 0.85 and cfg.augment.crop_padding == 2
    assert cfg_from(["--recipe", "A", "--tta", "flip", "--schedule", "linear"]).tta == "flip"
    assert cfg_from(["--recipe", "A", "--tta", "flip-shift"]).tta == "flip-shift"
    with pytest.raises((ValueError, SystemExit)):
        cfg_from(["--recipe", "A", "--tta", "shift"])
    assert cfg_from(["--recipe", "C", "--ema-decay", "0"]).ema.decay == 0.0  # off
    for argv in (["--tta", "mirror"], ["--schedule", "step"]):
        with pytest.raises(SystemExit):
            cfg_from(argv)
    with pytest.raises(ValueError, match="ema.decay: expected < 1"):
        cfg_from(["--recipe", "C", "--ema-decay", "1"])
    with pytest.raises(ValueError, match="optimizer.momentum: unknown setting"):
        cfg_from(["--recipe", "B", "--momentum", "0.9"])  # AdamW has betas
    with pytest.raises(ValueError, match="--ema-every|ema.every: expected >= 1"):
        cfg_from(["--recipe", "C", "--ema-every", "0"])


def test_progressive_resizing_flags_and_schedule():
    from resnet_native.training.config import reduced_size, train_image_sizes

    cfg = cfg_from(["--recipe", "C", "--epochs", "10", "--progressive-size", "16", "--progressive-until", "0.35"])
    assert cfg.progressive.to_dict() == {"size": 16, "until": 0.35, "mid_size": 0, "mid_until": 0.0}
    assert [reduced_size(cfg, e) for e in range(10)] == [16] * 4 + [None] * 6  # 3.5 epochs, rounded half up
    assert train_image_sizes(cfg) == (16, 32)
    off = cfg_from(["--recipe", "C", "--epochs", "10", "--progressive-size", "0"])
    assert off.progressive.size == 0 and train_image_sizes(off) == (32,)
    assert train_image_sizes(cfg_from(["--recipe", "A", "--progressive-size", "24"])) == (32,)  # until 0: none
    assert resume_differences(off, cfg) == ["progressive"]
    for size in ("4", "32", "40"):
        with pytest.raises(ValueError, match=r"progressive.size: expected 0 \(off\) or a size in \[8, 32\)"):
            cfg_from(["--recipe", "C", "--progressive-size", size])
    with pytest.raises(ValueError, match="progressive.until: expected < 1"):
        cfg_from(["--recipe", "C", "--progressive-size", "16", "--progressive-until", "1"])


def test_progressive_resizing_second_stage():
    from resnet_native.training.config import reduced_size, train_image_sizes

    ramp = ["--recipe", "C", "--epochs", "10", "--progressive-size", "16", "--progressive-until", "0.3",
            "--progressive-mid-size", "24", "--progressive-mid-until", "0.75"]
    cfg = cfg_from(ramp)
    assert [reduced_size(cfg, e) for e in range(10)] == [16] * 3 + [24] * 5 + [None] * 2  # 7.5 rounds half up
    assert train_image_sizes(cfg) == (16, 24, 32)
    assert resume_differences(cfg_from(ramp[:-4]), cfg) == ["progressive"]
    bad = {"--progressive-mid-size": ["12", "16", "32"], "--progressive-mid-until": ["0.3", "0.2"]}
    for flag, values in bad.items():
        for value in values:
            argv = ramp[: ramp.index(flag) + 1] + [value] + ramp[ramp.index(flag) + 2 :]
            with pytest.raises(ValueError, match=r"progressive.mid_size: expected 0 \(off\) or, after"):
                cfg_from(argv)
    with pytest.raises(ValueError, match="progressive.mid_size"):  # no first stage
        cfg_from(["--recipe", "A", "--progressive-mid-size", "24", "--progressive-mid-until", "0.5"])


def test_alternate_flip_and_zero_init_flags():
    cfg = cfg_from(["--recipe", "C", "--alternate-flip", "--zero-init-residual"])
    assert cfg.augment.alternate_flip and cfg.zero_init_residual
    base = cfg_from(["--recipe", "C"])
    assert not base.augment.alternate_flip and not base.zero_init_residual
    assert resume_differences(base, cfg) == ["zero_init_residual", "augment"]


def test_the_average_is_part_of_what_a_resume_must_repeat():
    a, b = cfg_from(["--recipe", "C"]), cfg_from(["--recipe", "C", "--ema-decay", "0.9"])
    assert resume_differences(a, b) == ["ema"]
    assert resume_differences(a, cfg_from(["--recipe", "C", "--tta", "none"])) == []  # evaluation only


def test_the_recipes_convolve_on_the_graph_engine_and_the_flag_overrides_it():
    assert cfg_from(["--recipe", "A"]).engine == "graph" and cfg_from(["--recipe", "B"]).engine == "graph"
    assert cfg_from(["--recipe", "B", "--engine", "legacy"]).engine == "legacy"
    assert TrainConfig.from_dict({"epochs": 3, "optimizer": {"lr": 0.1}}).engine == "auto"  # conv's own default


def test_shipped_recipes_use_only_known_keys():
    for path in RECIPES_DIR.glob("*.yaml"):
        assert TrainConfig.from_dict(load_recipe(path)).name == path.stem


def test_cli_flags_override_the_recipe():
    cfg = cfg_from(["--recipe", "B", "--model", "resnet50", "--epochs", "3", "--batch-size", "128",
                    "--eval-batch-size", "500", "--precision", "bf16", "--layout", "NCHW", "--seed", "4",
                    "--subset", "1000", "--warmup-epochs", "1.5", "--label-smoothing", "0.1", "--lr", "0.01",
                    "--weight-decay", "0.001", "--cutout", "8", "--deterministic"])
    assert (cfg.model, cfg.epochs, cfg.batch_size, cfg.eval_batch_size) == ("resnet50", 3, 128, 500)
    assert (cfg.precision, cfg.layout, cfg.seed, cfg.subset) == ("bf16", "NCHW", 4, 1000)
    assert cfg.schedule.to_dict() == {"name": "onecycle", "warmup_epochs": 1.5}
    assert cfg.label_smoothing == 0.1 and cfg.deterministic is True
    assert cfg.optimizer.lr == 0.01 and cfg.optimizer.weight_decay == 0.001
    assert cfg.augment.cutout == 8 and cfg.augment.autoaugment is True
    assert cfg.optimizer.name == "adamw"  # untouched keys keep the recipe's values
    assert cfg_from(["--no-cuda-graph"]).cuda_graph is False and cfg_from([]).cuda_graph is True
    args = cli.build_parser().parse_args(["--out", "runs/x", "--resume", "--no-progress", "--data", "d"])
    assert args.resume and args.no_progress and args.out == "runs/x" and args.data == "d"
    assert cli.default_out_dir(cfg_from([])) == pathlib.Path("runs/A-resnet18")


def test_recipe_from_a_yaml_file(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("epochs: 7\noptimizer:\n  name: sgd\n  lr: 5e-2\n  weight_decay: 5e-4\n")
    cfg = cfg_from(["--recipe", str(p)])
    # YAML 1.1 reads 5e-2 as a string; the config coerces numbers.
    assert cfg.name == "mine" and cfg.epochs == 7 and cfg.optimizer.lr == 0.05
    assert cfg.optimizer.weight_decay == 5e-4 and cfg.augment.crop_padding == 4


@pytest.mark.parametrize("bad, message", [
    ({"epochs": 0}, "epochs"),
    ({"epochs": 2.5}, "epochs"),
    ({"precision": "fp64"}, "precision"),
    ({"layout": "NWHC"}, "layout"),
    ({"model": "resnet20"}, "model"),
    ({"label_smoothing": 1.0}, "label_smoothing"),
    ({"optimizer": {"name": "rmsprop", "lr": 0.1}}, "optimizer.name"),
    ({"optimizer": {"name": "sgd"}}, "optimizer.lr"),
    ({"optimizer": {"name": "adamw", "lr": 1e-3, "betas": [0.9]}}, "optimizer.betas"),
    ({"schedule": {"name": "step"}}, "schedule.name"),
    ({"tta": "mirror"}, "tta: expected one of"),
    ({"tta": True}, "tta"),
    ({"ema": {"decay": 1.0}}, "ema.decay: expected < 1"),
    ({"ema": {"decay": -0.5}}, "ema.decay: expected >= 0"),
    ({"ema": {"decay": "high"}}, "ema.decay: expected a number"),
    ({"ema": {"every": 0}}, "ema.every: expected >= 1"),
    ({"ema": {"start": 1.0}}, "ema.start: expected < 1"),
    ({"ema": {"warmup": 3}}, "ema.warmup: unknown setting"),
    ({"ema": 0.999}, "ema: expected a mapping"),
    ({"schedule": {"name": "cosine", "warmup_epochs": 10}}, "warmup_epochs"),
    ({"augment": {"cutout": -2}}, "augment.cutout"),
    ({"batch_size": "many"}, "batch_size"),
    # bool("false") is True: only real booleans are accepted.
    ({"optimizer": {"name": "sgd", "lr": 0.1, "nesterov": "false"}}, "optimizer.nesterov"),
    ({"augment": {"flip": "false"}}, "augment.flip"),
    ({"augment": {"autoaugment": "false"}}, "augment.autoaugment"),
    ({"augment": {"autoaugment": 1}}, "augment.autoaugment"),
    ({"augment": {"alternate_flip": True, "flip": False}}, "augment.alternate_flip: needs augment.flip"),
    ({"augment": {"alternate_flip": True, "autoaugment": True}}, "augment.alternate_flip: .*not with"),
    ({"zero_init_residual": 1}, "zero_init_residual"),
    ({"deterministic": "false"}, "deterministic"),
    # Unknown keys, wrong types and out-of-range values name the key and say what was expected.
    ({"dtype": "fp16"}, "dtype: unknown setting .*it is called 'precision' now"),
    ({"epoch": 3}, "epoch: unknown setting"),
    ({"optimizer": {"name": "sgd", "lr": 0.1, "lr_decay": 0.5}}, "optimizer.lr_decay: unknown setting"),
    ({"optimizer": {"name": "sgd", "lr": 0.1, "betas": [0.9, 0.99]}}, "optimizer.betas: unknown setting"),
    ({"optimizer": {"name": "sgd", "lr": "fast"}}, "optimizer.lr: expected a number, got 'fast'"),
    ({"optimizer": {"name": "sgd", "lr": float("nan")}}, "optimizer.lr: expected a finite number"),
    ({"optimizer": {"name": "sgd", "lr": 10**400}}, "optimizer.lr: expected a number"),  # was an OverflowError
    ({"optimizer": {"name": "sgd", "lr": -0.1}}, r"optimizer.lr: expected >= 0.0, got -0.1"),
    ({"optimizer": {"name": "sgd", "lr": 0.1, "momentum": 1.5}}, "optimizer.momentum: expected < 1"),
    ({"optimizer": {"name": "adamw", "lr": 1e-3, "betas": [0.9, 1.0]}}, r"optimizer.betas\[1\]: expected < 1"),
    ({"optimizer": "sgd"}, "optimizer: expected a mapping"),
    ({"schedule": 3}, "schedule: expected a mapping"),
    ({"augment": {"cutout": 4.5}}, "augment.cutout: expected an int, got 4.5"),
    ({"augment": {"crop_padding": "4"}}, "augment.crop_padding: expected an int"),
    ({"seed": -1}, "seed: expected >= 0"),
    ({"seed": True}, "seed: expected an int"),
    ({"subset": 0}, "subset: expected >= 1"),
    ({"engine": "cudnn"}, "engine: expected one of"),
    ({"name": ""}, "name: expected a non-empty string"),
])
def test_invalid_configurations_name_the_key(bad, message):
    cfg = load_recipe("A")
    cfg.update(bad)
    cfg["epochs"] = bad.get("epochs", 10)
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_dict(cfg)


def test_missing_epochs_and_defaults():
    with pytest.raises(ValueError, match=r"epochs: missing \(set it in the recipe or with --epochs\)"):
        TrainConfig.from_dict({"optimizer": {"lr": 0.1}})
    with pytest.raises(ValueError, match="optimizer.lr: missing"):
        TrainConfig.from_dict({"epochs": 3})
    cfg = TrainConfig.from_dict({"epochs": 3, "optimizer": {"lr": 0.1}, "subset": None})
    assert (cfg.name, cfg.model, cfg.precision, cfg.layout, cfg.seed, cfg.subset) == (
        "custom", "resnet18", "fp16", "NHWC", 0, None)
    assert cfg.optimizer.name == "sgd" and cfg.optimizer.weight_decay == 0.0
    assert TrainConfig.from_dict({"epochs": 3, "optimizer": {"name": "adamw", "lr": 1e-3}}).optimizer.weight_decay \
        == 0.01
    assert isinstance(cfg.optimizer.lr, float) and isinstance(cfg.epochs, int)
    assert TrainConfig.from_dict({"epochs": 3.0, "optimizer": {"lr": 1}}).epochs == 3  # integral floats are ints


def test_command_line_values_go_through_the_same_checks(capsys):
    with pytest.raises(ValueError, match="label_smoothing: expected < 1"):
        cfg_from(["--label-smoothing", "1.0"])
    with pytest.raises(ValueError, match="optimizer.lr: expected >= 0"):
        cfg_from(["--lr", "-1"])
    with pytest.raises(SystemExit):
        cli.main(["--subset", "0"])
    assert "subset: expected >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--precision", "fp8"])
    with pytest.raises(SystemExit):  # the old flag is gone: --precision
        cli.build_parser().parse_args(["--dtype", "fp16"])


def test_every_construction_is_checked():
    cfg = cfg_from([])
    with pytest.raises(ValueError, match="seed: expected >= 0"):
        dataclasses.replace(cfg, seed=-1)
    with pytest.raises(ValueError, match="schedule.warmup_epochs: 300.0 must be shorter than epochs"):
        dataclasses.replace(cfg, schedule=dataclasses.replace(cfg.schedule, warmup_epochs=300))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 3
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg  # the dict form (config.yaml, checkpoints) round-trips


def test_old_checkpoints_dtype_key_is_read_as_precision():
    old = cfg_from(["--precision", "bf16"]).to_dict()
    old["dtype"] = old.pop("precision")  # a checkpoint written before the rename
    saved = TrainConfig.from_saved(old)
    assert saved.precision == "bf16"
    assert resume_differences(saved, cfg_from(["--precision", "bf16"])) == []
    assert resume_differences(saved, cfg_from(["--precision", "fp16", "--seed", "3"])) == ["precision", "seed"]


@pytest.mark.parametrize("text, message", [
    ("epochs: [1, 2\n", "not valid YAML"),  # unclosed flow sequence
    ("epochs: 3\n  optimizer: {lr: 0.1}\n\tbad: tab\n", "not valid YAML"),
    ("- 1\n- 2\n", "expected a YAML mapping at the top level, got list"),
    ("", "expected a YAML mapping at the top level, got nothing"),
    ("!!python/object/apply:os.system ['echo hi']\n", "not valid YAML"),  # safe_load refuses Python tags
    ("epochs: !!python/name:os.system\n", "not valid YAML"),
])
def test_malformed_recipe_files_name_the_file(tmp_path, text, message):
    p = tmp_path / "broken.yaml"
    p.write_text(text)
    with pytest.raises(ValueError, match=rf"^recipe {p}: {message}"):
        load_recipe(p)
    with pytest.raises(ValueError, match=rf"^recipe {p}: {message}"):
        cfg_from(["--recipe", str(p)])


def test_unreadable_recipe_files_name_the_file(tmp_path, capsys):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00 not text")
    with pytest.raises(ValueError, match=rf"^recipe {binary}: cannot be read"):
        load_recipe(binary)
    with pytest.raises(ValueError, match=rf"^recipe {tmp_path / 'absent.yaml'}: cannot be read"):
        load_recipe(tmp_path / "absent.yaml")
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    with pytest.raises(ValueError, match=rf"^recipe {folder}: cannot be read"):
        load_recipe(folder)
    # The command line reports it as a usage error, not a traceback.
    with pytest.raises(SystemExit):
        cli.main(["--recipe", str(binary)])
    assert f"recipe {binary}: cannot be read" in capsys.readouterr().err


def test_wrong_types_in_a_recipe_file_name_the_file_and_the_key(tmp_path):
    p = tmp_path / "typed.yaml"
    p.write_text("epochs: three\noptimizer: {name: sgd, lr: 0.1}\n")
    with pytest.raises(ValueError, match=rf"^recipe {p}: epochs: expected an int, got 'three'"):
        cfg_from(["--recipe", str(p)])
    p.write_text("epochs: 3\noptimizer: {name: sgd, lr: fast}\n")
    with pytest.raises(ValueError, match=rf"^recipe {p}: optimizer.lr: expected a number, got 'fast'"):
        cfg_from(["--recipe", str(p)])
    p.write_text("epochs: 3\noptimizer: {name: adamw, lr: 0.1, betas: [0.9, 2]}\n")
    with pytest.raises(ValueError, match=rf"^recipe {p}: optimizer.betas\[1\]: expected < 1"):
        cfg_from(["--recipe", str(p)])
    # A bad value from the command line names the key, not the file it was merged into.
    p.write_text("epochs: 3\noptimizer: {name: sgd, lr: 0.1}\n")
    with pytest.raises(ValueError, match=r"^optimizer.lr: expected >= 0"):
        cfg_from(["--recipe", str(p), "--lr", "-1"])
    # The recipe is plain data: a YAML date is not an epoch count either.
    p.write_text("epochs: 2024-01-01\noptimizer: {name: sgd, lr: 0.1}\n")
    with pytest.raises(ValueError, match=rf"^recipe {p}: epochs: expected an int"):
        cfg_from(["--recipe", str(p)])
