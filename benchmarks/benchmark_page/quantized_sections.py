"""The 8-bit engines' speed and accuracy sections."""

from .files import call_number, folder_key, load, newest_first, results_folder
from .markdown import command_from_args, environment_line, source_block, table


def quantized_rows(path):
    """{(model, batch, dtype, impl): row} of one benchmark file's uint8-input engines, each row with the
    float engine of its model and batch size ('base'), the quantize_from 'auto' chose for that batch size, and its
    file ('path', and 'source': the loaded document, so the sources block needs no second read)."""
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
        found[(r["model"], r["batch"], r["dtype"], r["impl"])] = {
            **r,
            "prefix": prefix,
            "base": base,
            "path": path,
            "source": d,
        }
    return found


def quantized_speed_section():
    """The newest results folder with 8-bit rows, its files merged (a later call's row wins)."""
    found = [
        (p, rows)
        for p in newest_first("*bench_infer*.json") + newest_first("*quant*.json")
        if (rows := quantized_rows(p))
    ]
    if not found:
        return ""
    newest = folder_key(results_folder(found[0][0]))
    merged = {}
    for path, rows in found:
        if folder_key(results_folder(path)) == newest:
            for key, row in rows.items():
                merged.setdefault(key, row)
    # By model and batch size, the float engine first.
    order = sorted(merged, key=lambda key: (key[0], key[1], key[2] not in ("fp16", "bf16"), key[3]))
    body = []
    for key in order:
        r = merged[key]
        body.append([*key[:3], r["prefix"], f"{r['median_ms']:.3f}", f"{r['base']['median_ms'] / r['median_ms']:.2f}"])
    sources = {r["path"]: r["source"] for r in sorted(merged.values(), key=lambda r: call_number(r["path"]))}
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
                    command_from_args("benchmarks/bench_infer.py", d["args"]),
                    environment_line(d["environment"]),
                )
                for path, d in sources.items()
            ),
        ]
    )


def accuracy_rows(d):
    """One row per engine of a quant_accuracy.py document, and the engine keys (dtype, quantize_from) it holds."""
    body, keys = [], []
    for name, r in d["results"].items():
        prefix = name.split("@")[1] if "@" in name else ("—" if name == "float" else "stem")
        engine = "fp16" if name == "float" else name.split("@")[0].replace("fp8", "FP8")
        if prefix != "—":
            keys.append((engine, prefix))
        shown = prefix if prefix != "auto" else f"auto (chose {r['quantize_from']})"
        gap = r.get("gap_points")
        body.append(
            [
                engine,
                shown,
                f"{100 * r['accuracy']:.2f}%",
                "—" if gap is None else f"{-gap:+.2f}",
                "—" if r.get("agreement") is None else f"{100 * r['agreement']:.2f}%",
                f"{r['build_seconds']:.1f}",
            ]
        )
    return body, keys


def quantized_accuracy_section():
    """The newest release's figures, then each older one that evaluated an engine no newer one did."""
    covered, blocks, images = set(), [], None
    for path in newest_first("*quant_A_accuracy.json"):
        d = load(path)
        body, keys = accuracy_rows(d)
        if covered.issuperset(keys):
            continue
        covered.update(keys)
        images = images or d["images"]
        prefixes = list(dict.fromkeys(prefix for _, prefix in keys))
        command = (
            "python -m resnet_native.train --recipe A --data cifar10-jpeg.tar.xz --out runs/A\n"
            "python -m resnet_native.release --run runs/A --version A --int8 --fp8 --data cifar10-jpeg.tar.xz "
            "--calibrate-on gpu\n"
            f"python tools/quant_accuracy.py --release cifar10_models/version_A --data cifar10-jpeg.tar.xz "
            f"--quantize-from {','.join(prefixes)}"
        )
        blocks += [
            table(["engine", "quantize_from", "accuracy", "change", "agreement with fp16", "build s"], body),
            "",
            source_block([path], command),
            "",
        ]
    if not blocks:
        return ""
    return "\n".join(
        [
            "## 8-bit engines' accuracy",
            "",
            f"A recipe-A release, calibrated for int8 and FP8 on the GPU, then the {images:,} CIFAR-10 test "
            'images through each engine at batch 256. "change" is the accuracy minus the fp16 engine\'s, in points; '
            '"agreement" the share of images classified as the fp16 engine classifies them. One table a release, '
            "newest first; an older one only for the engines no newer one evaluated.",
            "",
            *blocks[:-1],
        ]
    )
