"""The training step and inference sections: ours against PyTorch, from bench_model and bench_infer results."""

import re

from .files import call_number, folder_key, load, newest_first, results_folder
from .markdown import command_from_args, environment_line, source_block, table

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
