"""Write docs/benchmarks.md from the newest raw results under docs/lab-notes/results/.

    python benchmarks/make_benchmark_page.py            # rewrite docs/benchmarks.md
    python benchmarks/make_benchmark_page.py --check    # exit 1 when docs/benchmarks.md is out of date

Every number on the page is read from a results file, never typed. Each table names the folder and file it was
read from and, under it, the command that produced it (rebuilt from the file's own `args` where it has them).
A results folder is named <date>-<machine>[-s<N>]; "newest" means the latest date, then the highest N, then the
highest call number in the file name (`callN_...`).
"""

import argparse
import glob
import json
import pathlib
import re
import shlex
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "lab-notes" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"
RECIPES = ROOT / "resnet_native" / "recipes"

# Arguments of a benchmark's JSON that say where its output went, not what it measured.
NOT_COMMAND_ARGS = {"json", "markdown", "out", "inductor_cache", "algo_cache", "peak_tflops", "budget_s"}


# ---------------------------------------------------------------------------------------------------------- files


def folder_key(folder):
    m = re.match(r"(\d{4}-\d{2}-\d{2})-.*?(?:-s(\d+))?$", folder.name)
    return (m.group(1), int(m.group(2) or 0)) if m else (folder.name, 0)


def call_number(path):
    """The N of the first 'callN' folder or file name below the results folder (0 if none)."""
    for part in path.relative_to(RESULTS).parts[1:]:
        m = re.match(r"call(\d+)", part)
        if m:
            return int(m.group(1))
    return 0


def results_folder(path):
    """The results folder (date, GPU, session) a file lies in, directly or in a call's subfolder."""
    return RESULTS / path.relative_to(RESULTS).parts[0]


def newest_first(pattern):
    """Files matching the glob pattern anywhere below a results folder (in it, or in a call's subfolder), newest
    first: by the results folder's date and session, then the call."""
    files = {pathlib.Path(p) for p in glob.glob(str(RESULTS / "*" / "**" / pattern), recursive=True)}
    return sorted(files, key=lambda p: (folder_key(results_folder(p)), call_number(p), p.name), reverse=True)


def rel(path):
    return path.relative_to(ROOT).as_posix()


def load(path):
    return json.loads(path.read_text())


def environment_line(env):
    if not env:
        return ""
    cudnn = env.get("cudnn")
    cudnn = f"{cudnn // 10000}.{cudnn // 100 % 100}.{cudnn % 100}" if isinstance(cudnn, int) else cudnn
    parts = [env.get("gpu"), f"cuDNN {cudnn}" if cudnn else None, f"cupy {env['cupy']}" if env.get("cupy") else None]
    if env.get("torch"):
        parts.append(f"torch {env['torch']}")
    return ", ".join(p for p in parts if p)


def command_from_args(script, args):
    """The command line that a benchmark's recorded argparse namespace stands for."""
    words = ["python", script]
    for key, value in args.items():
        if key in NOT_COMMAND_ARGS or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            words.append(flag)
        elif isinstance(value, list):
            items = [":".join(map(str, v)) if isinstance(v, list) else str(v) for v in value]
            if key == "compile" and not items:
                continue
            words += [flag, shlex.quote(",".join(items)) if items else "''"]
        else:
            words += [flag, str(value)]
    return " ".join(words)


# ---------------------------------------------------------------------------------------------------------- tables


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def source_block(files, command, env=""):
    where = ", ".join(f"`{rel(f)}`" for f in files)
    lines = [f"Read from {where}" + (f" ({env})." if env else ".")]
    lines += ["", "```bash", command, "```"]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- training step (bench_model)


def bench_model_text_rows(path):
    """The last 'training step, ms (median)' table that bench_model.py printed, as dicts."""
    text = path.read_text().splitlines()
    starts = [i for i, line in enumerate(text) if line.startswith("training step")]
    if not starts:
        return []
    block = text[starts[-1] + 1 :]
    header = re.split(r"\s{2,}", block[0].strip())
    rows = []
    for line in block[2:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) != len(header):
            break
        r = dict(zip(header, cells, strict=False))
        rows.append(
            {
                "model": r["model"],
                "image": int(r["image"]),
                "dtype": r["dtype"],
                "batch": int(r["batch"]),
                "ours_graph_ms": float(r["ours graph"]),
                "torch_graph_ms": float(r["torch graph"]) if r["torch graph"] not in ("", "-") else None,
                "mfu_pct": float(r["MFU %"]),
                "ours_mem_gib": float(r["ours GiB"]),
                "torch_mem_gib": float(r["torch GiB"]) if r.get("torch GiB", "-") != "-" else None,
            }
        )
    return rows


def model_args_from_commands(path):
    """MODEL_ARGS of a `tools/gpu_check.sh models` line in the call's saved commands, if any."""
    commands = path.parent / f"call{call_number(path)}_commands.sh"
    if not commands.exists():
        return None
    m = re.search(r'MODEL_ARGS="([^"]*)"[^\n]*gpu_check\.sh models', commands.read_text())
    return m.group(1) if m else None


def bench_model_sources():
    """(path, rows, command, environment) of every bench_model result with PyTorch rows, newest first."""
    out = []
    for path in newest_first("*bench_model*"):
        if path.suffix == ".json":
            d = load(path)
            if not isinstance(d, dict) or "args" not in d:
                continue
            rows = [r for r in d.get("rows", []) if r.get("torch_graph_ms")]
            if rows:
                out.append(
                    (path, rows, command_from_args("benchmarks/bench_model.py", d["args"]), d.get("environment"))
                )
        elif path.suffix == ".txt":
            rows = [r for r in bench_model_text_rows(path) if r["torch_graph_ms"]]
            extra = model_args_from_commands(path)
            if rows and extra is not None:
                out.append((path, rows, f"python benchmarks/bench_model.py {extra}".strip(), None))
    return out


def training_section():
    sources = bench_model_sources()
    parts = [
        "## Training step against PyTorch",
        "",
        "Median milliseconds per captured training step (SGD Nesterov, random data, NHWC), ours replayed from a CUDA "
        "graph against PyTorch's whole step captured in `torch.cuda.graph` (autocast, channels_last, "
        '`cudnn.benchmark`), in the same process. "× PyTorch" above 1 means resnet_native is faster. Memory: our '
        "cupy pools and workspace after the captured step, against PyTorch's peak reserved. For each precision, the "
        "newest run that measured it.",
    ]
    seen = set()
    for path, rows, command, env in sources:
        dtypes = sorted({r["dtype"] for r in rows} - seen)
        if not dtypes:
            continue
        seen.update(dtypes)
        body = []
        for r in rows:
            if r["dtype"] not in dtypes:
                continue
            ratio = r["torch_graph_ms"] / r["ours_graph_ms"]
            mem = "-" if not r.get("torch_mem_gib") else f"{r['ours_mem_gib']:.2f} / {r['torch_mem_gib']:.2f}"
            body.append(
                [
                    r["model"],
                    f"{r['image']}²",
                    r["dtype"],
                    r["batch"],
                    f"{r['ours_graph_ms']:.3f}",
                    f"{r['torch_graph_ms']:.3f}",
                    f"{ratio:.2f}",
                    f"{r['mfu_pct']:.1f}",
                    mem,
                ]
            )
        ratios = [r["torch_graph_ms"] / r["ours_graph_ms"] for r in rows if r["dtype"] in dtypes]
        parts += [
            "",
            f"### {', '.join(dtypes)}: {min(ratios):.2f}–{max(ratios):.2f}× PyTorch over {len(ratios)} configurations",
            "",
            table(
                [
                    "model",
                    "image",
                    "precision",
                    "batch",
                    "ours ms",
                    "PyTorch ms",
                    "× PyTorch",
                    "MFU %",
                    "GiB ours / PyTorch",
                ],
                body,
            ),
            "",
            source_block([path], command, environment_line(env) if env else "NVIDIA H200, cuDNN 9.19.0"),
        ]
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------ inference (bench_infer)


def rows_by(d, impl):
    return {(r["model"], r["dtype"], r["batch"]): r for r in d["rows"] if r["impl"] == impl}


def inference_section():
    parts = [
        "## Inference against PyTorch",
        "",
        "Median latency per call (CUDA events, inputs rotated) of the `InferenceEngine` (BatchNorm folded, one CUDA "
        "graph per batch size) against PyTorch's forward of the same weights captured in a CUDA graph "
        "(torchvision ResNet, eval, channels_last, `cudnn.benchmark`, `inference_mode`). CIFAR stem, NHWC. "
        '"engine / PyTorch" below 1 means the engine is faster.',
    ]
    for path in newest_first("*bench_infer*.json"):
        d = load(path)
        if not rows_by(d, "torch_graph") or not rows_by(d, "engine") or d["args"].get("quick"):
            continue
        engine, torch = rows_by(d, "engine"), rows_by(d, "torch_graph")
        body, ratios = [], []
        for key, e in engine.items():
            if key in torch:
                ratio = e["median_ms"] / torch[key]["median_ms"]
                ratios.append(ratio)
                body.append(
                    [
                        *key,
                        f"{e['median_ms']:.3f}",
                        f"{e['p99_ms']:.3f}",
                        f"{torch[key]['median_ms']:.3f}",
                        f"{ratio:.2f}",
                    ]
                )
        parts += [
            "",
            f"### Engine / PyTorch CUDA graph: {min(ratios):.2f}–{max(ratios):.2f} over {len(ratios)} configurations",
            "",
            table(
                ["model", "precision", "batch", "engine ms", "engine p99 ms", "PyTorch graph ms", "engine / PyTorch"],
                body,
            ),
            "",
            source_block(
                [path], command_from_args("benchmarks/bench_infer.py", d["args"]), environment_line(d["environment"])
            ),
        ]
        break
    compiled = [p for p in newest_first("*compile*.json") if rows_by(load(p), "torch_compile")]
    if compiled:
        newest = folder_key(results_folder(compiled[0]))
        compiled = sorted((p for p in compiled if folder_key(results_folder(p)) == newest), key=lambda p: p.name)
        body = []
        for path in compiled:
            d = load(path)
            engine, comp = rows_by(d, "engine"), rows_by(d, "torch_compile")
            for key, c in comp.items():
                e = engine[key]
                body.append(
                    [
                        *key,
                        f"{e['median_ms']:.3f}",
                        f"{c['median_ms']:.3f}",
                        f"{c.get('compile_s', 0):.0f}",
                        f"{c['median_ms'] / e['median_ms']:.2f}",
                    ]
                )
        commands = "\n".join(command_from_args("benchmarks/bench_infer.py", load(p)["args"]) for p in compiled)
        parts += [
            "",
            '### Against `torch.compile(mode="max-autotune")`',
            "",
            table(
                ["model", "precision", "batch", "engine ms", "torch.compile ms", "compile s", "torch.compile / engine"],
                body,
            ),
            "",
            source_block(compiled, commands, environment_line(load(compiled[0])["environment"])),
        ]
    return "\n".join(parts)


def quantized_rows(path):
    """{(model, batch, dtype, impl): row} of one benchmark file's uint8-input engines, each row with the
    float engine of its model and batch size ('base') and the quantize_from 'auto' chose for that batch size."""
    d = load(path)
    if "rows" not in d or not d.get("args", {}).get("quant_dtypes"):
        return {}
    rows = [r for r in d["rows"] if r["impl"].startswith("engine_uint8")]
    bases = {(r["model"], r["batch"]): r for r in rows if r["dtype"] in ("fp16", "bf16")}
    found = {}
    for r in rows:
        base = bases.get((r["model"], r["batch"]))
        if base is None:
            continue
        prefix = r["impl"].removeprefix("engine_uint8").removeprefix("_from_") or ("—" if r is base else "stem")
        if prefix == "auto":
            engine = d.get("engines", {}).get(f"{r['model']}:{r['dtype']}:auto", {})
            chosen = engine.get("quantize_from_by_batch", {}).get(str(r["batch"]), engine.get("quantize_from"))
            prefix = f"auto (chose {chosen})" if chosen else "auto"
        found[(r["model"], r["batch"], r["dtype"], r["impl"])] = {**r, "prefix": prefix, "base": base, "path": path}
    return found


def quantized_speed_section():
    """The newest results folder with 8-bit rows, its files merged (a later call's row wins)."""
    files = [p for p in newest_first("*bench_infer*.json") + newest_first("*quant*.json") if quantized_rows(p)]
    if not files:
        return ""
    newest = folder_key(results_folder(files[0]))
    merged = {}
    for path in files:
        if folder_key(results_folder(path)) == newest:
            for key, row in quantized_rows(path).items():
                merged.setdefault(key, row)
    order = sorted(merged, key=lambda key: (key[0], key[1], key[2] not in ("fp16", "bf16"), key[3]))
    body = [
        [*key[:3], r["prefix"], f"{r['median_ms']:.3f}", f"{r['base']['median_ms'] / r['median_ms']:.2f}"]
        for key, r in ((key, merged[key]) for key in order)
    ]
    sources = sorted({r["path"] for r in merged.values()}, key=call_number)
    return "\n".join(
        [
            "## 8-bit engines' speed",
            "",
            "uint8 images in, CUDA-graph replay, median ms. `quantize_from` names the first stage that runs in "
            "8 bits (the ones before it run in fp16; 'auto' chooses per batch size, the fp16 plan among the "
            "candidates); \"× fp16\" is the fp16 engine's time over this one's, both in the same run.",
            "",
            table(["model", "batch", "precision", "quantize_from", "median ms", "× fp16"], body),
            "",
            *(
                source_block(
                    [path],
                    command_from_args("benchmarks/bench_infer.py", load(path)["args"]),
                    environment_line(load(path)["environment"]),
                )
                for path in sources
            ),
        ]
    )


def quantized_accuracy_section():
    files = newest_first("*quant_A_accuracy.json")
    if not files:
        return ""
    path = files[0]
    d = load(path)
    body, prefixes = [], []
    for name, r in d["results"].items():
        prefix = name.split("@")[1] if "@" in name else ("—" if name == "float" else "stem")
        if prefix not in prefixes and prefix != "—":
            prefixes.append(prefix)
        shown = prefix if prefix != "auto" else f"auto (chose {r['quantize_from']})"
        gap = r.get("gap_points")
        body.append(
            [
                "fp16" if name == "float" else name.split("@")[0].replace("fp8", "FP8"),
                shown,
                f"{100 * r['accuracy']:.2f}%",
                "—" if gap is None else f"{-gap:+.2f}",
                "—" if r.get("agreement") is None else f"{100 * r['agreement']:.2f}%",
                f"{r['build_seconds']:.1f}",
            ]
        )
    command = (
        "python -m resnet_native.train --recipe A --data cifar10-jpeg.tar.xz --out runs/A\n"
        "python -m resnet_native.release --run runs/A --version A --int8 --fp8 --data cifar10-jpeg.tar.xz "
        "--calibrate-on gpu\n"
        f"python tools/quant_accuracy.py --release cifar10_models/version_A --data cifar10-jpeg.tar.xz "
        f"--quantize-from {','.join(prefixes)}"
    )
    return "\n".join(
        [
            "## 8-bit engines' accuracy",
            "",
            f"One recipe-A release, calibrated for int8 and FP8 on the GPU, then the {d['images']:,} CIFAR-10 test "
            'images through each engine at batch 256. "change" is the accuracy minus the fp16 engine\'s, in points; '
            '"agreement" the share of images classified as the fp16 engine classifies them.',
            "",
            table(["engine", "quantize_from", "accuracy", "change", "agreement with fp16", "build s"], body),
            "",
            source_block([path], command),
        ]
    )


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


def as_shipped(recipe, summary, args):
    """The seed of a run of the recipe as shipped (None when the run's settings were not the recipe's)."""
    settings = recipe_settings(recipe)
    if summary.get("recipe") != recipe or not summary.get("completed", True):
        return None
    if (
        summary.get("epochs") != int(settings["epochs"])
        or summary.get("epochs_done", summary["epochs"]) != summary["epochs"]
    ):
        return None
    words, seed = shlex.split(args or ""), ""
    names = {"--epochs": "epochs", "--batch-size": "batch_size", "--lr": "lr", "--eval-every": "eval_every"}
    for flag, value in zip(words[::2], words[1::2], strict=False):
        if flag == "--seed":
            seed = value
        elif flag not in names or not same_value(value, settings[names[flag]]):
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
            seed = as_shipped(recipe, summary, entry.get("args"))
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
        "Every recorded run of each recipe exactly as shipped (the YAML's epochs, batch size and learning rate; "
        "only the seed may differ). ResNet-18, fp16, NHWC, on one H200 or H100 (the folder's name says which). "
        "Accuracy: the final test-set accuracy, and with flip test-time augmentation where the recipe has it. "
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
                f"{100 * s['test_acc_tta']:.2f}%" if s.get("test_acc_tta") is not None else "",
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


# ------------------------------------------------------------------------------------------------------ serving


def serving_section():
    files = [p for p in newest_first("*bench_serve*.json") if load(p).get("args", {}).get("model")]
    if not files:
        return ""
    newest = folder_key(results_folder(files[0]))
    files = [p for p in files if folder_key(results_folder(p)) == newest and load(p)["args"].get("client_processes")]
    body, commands = [], []
    for path in sorted(files, key=lambda p: p.name):
        d = load(path)
        commands.append(command_from_args("benchmarks/bench_serve.py", d["args"]))
        for mode, m in d["modes"].items():
            body.append(
                [
                    d["args"]["model"],
                    mode,
                    m.get("max_batch", "-"),
                    m["clients"],
                    m["ok"],
                    m["failed"],
                    f"{m['images_per_s']:.0f}",
                    f"{m['p50_ms']:.2f}",
                    f"{m['p99_ms']:.2f}",
                    f"{m['mean_batch']:.2f}",
                ]
            )
    return "\n".join(
        [
            "## Serving over HTTP",
            "",
            "Loopback load test of `python -m resnet_native.serve` (an fp16 engine of an untrained network): "
            "`batched` is the server as shipped, `server_batch_1` the same server with batching off, `sequential` "
            "one engine call per image with no HTTP.",
            "",
            table(
                ["model", "mode", "max batch", "clients", "ok", "failed", "images/s", "p50 ms", "p99 ms", "mean batch"],
                body,
            ),
            "",
            source_block(
                sorted(files, key=lambda p: p.name),
                "\n".join(commands),
                environment_line(load(files[0])["environment"]),
            ),
        ]
    )


# ---------------------------------------------------------------------------------------------------------- page


def page():
    sections = [
        "# Benchmarks",
        "",
        "<!-- Generated by benchmarks/make_benchmark_page.py from docs/lab-notes/results/; do not edit by hand. -->",
        "",
        "The newest measurement of each kind, read from the raw result files in "
        "[lab-notes/results/](lab-notes/results/); the run-by-run log that explains them is "
        "[lab-notes/RESULTS.md](lab-notes/RESULTS.md). On one NVIDIA H200 or H100 with cuDNN 9.19.0 and CUDA 13 "
        "(driver 580), PyTorch 2.11 (cu130, the same cuDNN) as the comparison. Under each table: the command "
        "that produced it and the GPU it ran on. Speeds compare against PyTorch in the same process; machines of "
        "the same kind differ by a few per cent, so compare within a table.",
        "",
        training_section(),
        "",
        inference_section(),
        "",
        quantized_speed_section(),
        "",
        quantized_accuracy_section(),
        "",
        recipes_section(),
        "",
        serving_section(),
        "",
    ]
    text = "\n".join(sections)
    return re.sub(r"\n{3,}", "\n\n", text)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the page differs from what would be written")
    p.add_argument("--out", type=pathlib.Path, default=PAGE)
    args = p.parse_args(argv)
    text = page()
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is out of date: run python benchmarks/make_benchmark_page.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
