"""The serving section: the newest loopback load tests of the HTTP server."""

from .files import folder_key, load, newest_first, results_folder
from .markdown import command_from_args, environment_line, source_block, table

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
