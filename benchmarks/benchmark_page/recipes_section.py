"""The recipes section: every recorded run of each recipe as shipped."""

import re
import shlex
import statistics

from .files import RECIPES, folder_key, load, newest_first, results_folder
from .markdown import table

# ------------------------------------------------------------------------------------------------------ recipes


def recipe_settings(name):
    """The shipped recipe's values that a run's overrides are compared with (flat YAML read without a parser
    dependency: `key: value` lines, nested keys by their last name)."""
    values = {}
    for line in (RECIPES / f"{name}.yaml").read_text().splitlines():
        m = re.match(r"\s*([a-z_]+):\s*([^#\s][^#]*?)\s*(?:#.*)?$", line)
        if m:
            values.setdefault(m.group(1), m.group(2))
    return values


def same_value(a, b):
    try:
        return float(a) == float(b)
    except ValueError:
        return str(a) == str(b)


# The results folder from which a recipe has its current definition, for what a run's summary does not record
# (recipe C's whitened stem, from session 45 on; its progressive resizing from session 31): an older folder's runs
# are of an earlier definition.
DEFINED_SINCE = {"C": ("2026-12-07", 45)}


def as_shipped(recipe, summary, args, folder=("9999", 0)):
    """The seed of a run of the recipe as shipped (None when the run's settings were not the recipe's). folder: the
    results folder's key (folder_key), checked against DEFINED_SINCE."""
    settings = recipe_settings(recipe)
    if summary.get("recipe") != recipe or not summary.get("completed", True):
        return None
    if folder < DEFINED_SINCE.get(recipe, ("", 0)):
        return None
    off = {"size": 0, "until": 0.0, "mid_size": 0, "mid_until": 0.0}  # older summaries lack the second stage
    shipped = {key: type(value)(settings.get(key, value)) for key, value in off.items()}
    if "progressive" in summary and {**off, **(summary["progressive"] or {})} != shipped:
        return None
    stem = {"init": settings.get("init", "random"), "frozen": False}  # as shipped; older summaries lack it
    if {key: (summary.get("stem") or stem).get(key, value) for key, value in stem.items()} != stem:
        return None
    if (
        summary.get("epochs") != int(settings["epochs"])
        or summary.get("epochs_done", summary["epochs"]) != summary["epochs"]
    ):
        return None
    words, seed = shlex.split(args or ""), ""
    names = {"--epochs": "epochs", "--batch-size": "batch_size", "--lr": "lr", "--eval-every": "eval_every",
             "--progressive-size": "size", "--progressive-until": "until", "--progressive-mid-size": "mid_size",
             "--progressive-mid-until": "mid_until", "--stem-init": "init"}
    for flag, value in zip(words[::2], words[1::2], strict=False):
        if flag == "--seed":
            seed = value
        elif flag == "--tta":  # evaluation only: the plain accuracy is the recipe's, the TTA one sits beside it
            continue
        elif flag not in names or not same_value(value, {**settings, **shipped}[names[flag]]):
            return None
    return seed


def recipe_runs(recipe):
    runs = []
    for path in newest_first("*.json"):
        if "not_kept" in path.name or "profiled" in path.name:
            continue
        d = load(path)
        entries = d if isinstance(d, list) else [d]
        for entry in entries:
            if not isinstance(entry, dict):
                continue
            summary = entry.get("summary", entry)
            if not isinstance(summary, dict) or "test_acc" not in summary:
                continue
            seed = as_shipped(recipe, summary, entry.get("args"), folder_key(results_folder(path)))
            if seed is None:
                continue
            if not seed:
                m = re.search(r"seed(\d+)", path.name)
                seed = m.group(1) if m else "—"
            fresh = entry.get("fresh") is True or "fresh" in path.name or "fresh machine" in str(entry.get("note", ""))
            if "cached" in path.name:
                fresh = False
            label = path.name if not entry.get("name") else f"{path.name} ({entry['name']})"
            runs.append((path, label, seed, fresh, summary))
    return runs


def recipes_section():
    parts = [
        "## Recipes",
        "",
        "Every recorded run of each recipe exactly as shipped (the YAML's epochs, batch size, learning rate and "
        "progressive resizing; only the seed and the evaluation's `--tta` may differ; recipe C's runs from before it "
        "trained its early epochs downscaled, session 31, are of an earlier definition and left out). ResNet-18, "
        "fp16, NHWC, on one H200 or H100 (the folder's name says which). "
        "Accuracy: the final test-set accuracy, and with test-time augmentation where the run had it (its mode: "
        "`flip`, or `flip-shift`, which adds the pair shifted a pixel each way). "
        "Time: the trainer's wall time (`wall_time_s`: data, warm-up, training, evaluation and checkpoints). "
        '"fresh" marks the first run on a new machine (JPEGs decoded, nothing cached); the others had the decoded '
        "data cached or were not marked. The code got faster between runs, so the times of the newest folder are "
        'the ones to read. Seed "—": not recorded in the file (the recipe\'s seed is 0).',
    ]
    for recipe, command in (
        ("A", "python -m resnet_native.train --recipe A --data cifar10-jpeg.tar.xz [--seed S]"),
        ("B", "python -m resnet_native.train --recipe B --data cifar10-jpeg.tar.xz [--seed S]"),
        ("C", "python -m resnet_native.train --recipe C --data cifar10-jpeg.tar.xz [--seed S]"),
    ):
        runs = recipe_runs(recipe)
        if not runs:
            continue
        accs = [100 * s["test_acc"] for *_, s in runs]
        newest = folder_key(results_folder(runs[0][0]))
        latest = [
            s["wall_time_s"]
            for p, _, _, _, s in runs
            if folder_key(results_folder(p)) == newest and s.get("wall_time_s")
        ]
        seeds = sorted({seed for _, _, seed, _, _ in runs if seed != "—"})
        body = [
            [
                results_folder(p).name,
                label,
                seed,
                "fresh" if fresh else "",
                f"{100 * s['test_acc']:.2f}%",
                f"{100 * s['test_acc_tta']:.2f}% {s.get('tta', 'flip')}" if s.get("test_acc_tta") is not None else "",
                f"{s['wall_time_s']:.1f}" if s.get("wall_time_s") else "-",
                f"{s['train_images_per_s'] / 1000:.1f}k" if s.get("train_images_per_s") else "-",
            ]
            for p, label, seed, fresh, s in runs
        ]
        parts += [
            "",
            f"### Recipe {recipe}: {min(accs):.2f}–{max(accs):.2f}% over {len(accs)} runs "
            f"(seeds {', '.join(seeds) if seeds else 'not recorded'}; mean {statistics.mean(accs):.2f}%), "
            + (
                f"{min(latest):.1f}–{max(latest):.1f} s in the newest folder's {len(latest)} runs"
                if len(latest) > 1
                else f"{latest[0]:.1f} s in the newest folder's run"
            ),
            "",
            table(["folder", "file (run)", "seed", "", "test acc", "with TTA", "wall s", "train img/s"], body),
            "",
            "```bash",
            command,
            "```",
        ]
    return "\n".join(parts)
