"""The Markdown pieces every section uses: tables, and the source block under each (the file, the command that
produced it, the GPU)."""

import shlex

from .files import rel

# Arguments of a benchmark's JSON that say where its output went, not what it measured.
NOT_COMMAND_ARGS = {"json", "markdown", "out", "inductor_cache", "algo_cache", "peak_tflops", "budget_s"}


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
