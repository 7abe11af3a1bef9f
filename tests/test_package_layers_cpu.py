"""The package's folders are its layers: every import points to the same layer or one below, nothing imports in a
cycle, only _core and ops touch the native core, and an import inside a function says why it is there."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "resnet_native"

# Bottom to top. A module may import its own layer and the layers below; the package's top-level modules
# (__init__, _compat, train) may import anything.
LAYERS = ("_core", "formats", "quantization", "reference", "ops", "distributed", "data", "nn", "optim", "inference",
          "training", "release", "serve")
NATIVE_CALLERS = ("_core", "ops")
LAZY_MARK = "# lazy:"
# The packages a function may import on first use, and why: everything else is imported at the top of its module.
LAZY_PACKAGES = {
    "cupy": "`import resnet_native` works without a GPU, and importing cupy costs start-up time",
    "cupyx": "as cupy",
    "nvidia": "the cuDNN wheel is optional (CUDNN_HOME or a system cuDNN serve too)",
    "PIL": "image decoding is needed only by the classifier's inputs, AutoAugment and the server",
    "yaml": "read only with a recipe or a release's config",
    "safetensors": "read only with a release's weights",
    "matplotlib": "the optional logging extra; slow to import",
    "tensorboard": "the optional logging extra; slow to import",
    "tqdm": "the progress bar only when one is shown",
    "onnx": "the optional onnx extra",
    "onnxruntime": "the optional onnx extra",
}


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _target(name: str) -> str:
    """The module an import of `name` loads: itself, or the package holding the attribute."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(module: str, path: pathlib.Path):
    """(target module, line, inside a function, source line) of every import of the package in one module."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    lines = path.read_text().splitlines()
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    nested = {id(n) for f in functions for n in ast.walk(f) if n is not f}
    in_function = {id(n) for f in functions for n in ast.walk(f)} | nested
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.split(".")[0] == "resnet_native":
                source = node.module.partition(".")[2]
            else:
                continue
            for alias in node.names:
                full = f"{source}.{alias.name}" if source else alias.name
                target = "_C" if alias.name == "_C" else _target(full) if full in MODULES else _target(source)
                yield (target, alias.name,
                       node.lineno, id(node) in in_function, lines[node.lineno - 1])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "resnet_native":
                    yield (_target(alias.name.partition(".")[2]), None, node.lineno, id(node) in in_function,
                           lines[node.lineno - 1])


def _layer(module: str) -> int | None:
    top = module.split(".")[0]
    return LAYERS.index(top) if top in LAYERS else None


IMPORTS = {m: list(_imports(m, p)) for m, p in MODULES.items()}


def test_every_folder_is_a_layer():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(LAYERS), f"package folders that are not exactly the layers: {folders ^ set(LAYERS)}"
    top = {m for m in MODULES if "." not in m and m not in LAYERS}
    assert top == {"", "_compat", "train"}, f"top-level modules beside the layers: {sorted(top - {''})}"


def test_imports_point_down():
    upward = []
    for module, imports in IMPORTS.items():
        own = _layer(module)
        if own is None:
            continue
        for target, _, line, _, _ in imports:
            theirs = _layer(target)
            if theirs is None and target not in ("", "_C"):
                upward.append(f"{module}:{line} imports the top-level {target or 'package'}")
            elif theirs is not None and theirs > own:
                upward.append(f"{module}:{line} ({LAYERS[own]}) imports {target} ({LAYERS[theirs]})")
            elif target == "" and own is not None:
                upward.append(f"{module}:{line} imports the package's top level")
    assert not upward, "imports that point up:\n" + "\n".join(upward)


def test_only_core_and_ops_call_the_native_core():
    callers = sorted({f"{m}:{line}" for m, imports in IMPORTS.items() for target, name, line, _, _ in imports
                      if name == "_C" and _layer(m) is not None and m.split(".")[0] not in NATIVE_CALLERS})
    assert not callers, f"modules above ops that import _C: {callers}"


def test_no_import_cycles():
    graph = {m: {t for t, *_ in imports if t in MODULES and t != m} for m, imports in IMPORTS.items()}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_imports_inside_functions_say_why():
    unexplained = [f"{m}:{line}: {text.strip()}" for m, imports in IMPORTS.items()
                   for _, _, line, inside, text in imports if inside and LAZY_MARK not in text]
    assert not unexplained, (f"imports of the package inside functions need a reason ('{LAZY_MARK} ...' on the line):\n"
                             + "\n".join(unexplained))


def test_other_packages_imported_inside_functions_are_the_declared_lazy_ones():
    undeclared = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for node in ast.walk(function):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module]
                else:
                    continue
                undeclared += [f"{module}:{node.lineno}: {name}" for name in names
                               if name.split(".")[0] not in LAZY_PACKAGES and name.split(".")[0] != "resnet_native"]
    assert not undeclared, "imports inside functions of packages not in LAZY_PACKAGES:\n" + "\n".join(undeclared)


@pytest.mark.parametrize("old, new", [("resnet_native.conv", "resnet_native.ops.conv"),
                                      ("resnet_native.layers.conv2d", "resnet_native.nn.layers.conv2d"),
                                      ("resnet_native.classifier", "resnet_native.release.classifier"),
                                      ("resnet_native.quantization.simulate", "resnet_native.inference.simulate")])
def test_old_import_paths_still_work(old, new):
    import importlib
    import sys

    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match="moved to"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)
    with pytest.warns(DeprecationWarning, match="moved to"):
        from resnet_native.quantization import calibrate  # noqa: F401
