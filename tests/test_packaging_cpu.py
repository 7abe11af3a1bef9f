"""Packaging on any machine: the build backend's flavour logic and requirements, what the built extension says about
itself (build_info, no debug info), the import errors of a source tree without an extension and of a missing
cuDNN, the GPU-skip summary line, and the package's third-party imports against its declared dependencies.
(The sdist, the wheel built from it, the CUDA 12 build and auditwheel are checked by .ci/run.)"""

import ast
import importlib.metadata
import json
import os
import pathlib
import re
import shutil
import struct
import subprocess
import sys

import pytest

import resnet_native as rn

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "build_backend"))

import resnet_native_build as backend  # noqa: E402
from resnet_native_build import cutlass, fatbinary, flavours, toolchain  # noqa: E402


@pytest.fixture
def no_build_env(monkeypatch):
    for name in ("RESNET_NATIVE_CUDA", "CUDNN_HOME", "CUDA_HOME", "CUDA_PATH", "RESNET_NATIVE_CLANG",
                 "RESNET_NATIVE_CUDA_ARCHS", "RESNET_NATIVE_CUTLASS", "CUTLASS_DIR"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# --- the build backend --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("major", [12, 13])
def test_runtime_requirements_follow_the_flavour(major):
    other = 25 - major
    reqs = flavours.runtime_requirements(flavours.FLAVOURS[major], cudnn_from_wheel=True)
    assert f"cupy-cuda{major}x" in " ".join(reqs) and f"nvidia-cudnn-cu{major}" in " ".join(reqs)
    assert f"cuda{other}" not in " ".join(reqs) and f"cu{other}" not in " ".join(reqs)
    assert {"numpy", "safetensors", "pyyaml", "tqdm", "pillow"} <= {re.split(r"[<>=]", r)[0] for r in reqs}
    without = flavours.runtime_requirements(flavours.FLAVOURS[major], cudnn_from_wheel=False)
    assert not any(r.startswith("nvidia-cudnn") for r in without)


def test_flavour_setting_is_checked(no_build_env):
    no_build_env.setenv("RESNET_NATIVE_CUDA", "11")
    with pytest.raises(SystemExit, match="RESNET_NATIVE_CUDA='11': expected 12 or 13"):
        toolchain.default_major()
    no_build_env.setenv("RESNET_NATIVE_CUDA", "12")
    assert toolchain.default_major() == 12


def test_default_flavour_is_the_local_toolkits_else_13(no_build_env, tmp_path):
    no_build_env.setattr(toolchain, "_local_toolkits", lambda: [])
    assert toolchain.default_major() == flavours.WHEEL_FLAVOUR == 13
    root = tmp_path / "cuda-12.6"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "nvcc").write_text("")
    (root / "include").mkdir()
    (root / "include" / "cuda.h").write_text("#define CUDA_VERSION 12060\n")
    no_build_env.setattr(toolchain, "_local_toolkits", lambda: [str(root)])
    assert toolchain.default_major() == 12 and toolchain.local_toolkit(12) == str(root)
    assert toolchain.local_toolkit(13) is None


def fake_cudnn(root):
    (root / "include").mkdir(parents=True)
    (root / "include" / "cudnn_version.h").write_text("#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 1\n")
    (root / "lib").mkdir()
    (root / "lib" / "libcudnn.so.9").write_text("")
    return root


def test_build_requirements_ask_only_for_what_is_missing(no_build_env, tmp_path):
    no_build_env.setattr(toolchain, "_local_toolkits", lambda: [])
    no_build_env.setattr(toolchain, "_system_cudnn", lambda major: None)
    reqs = backend.extension_build_requirements()
    assert set(flavours.FLAVOURS[13].toolkit_wheels) <= set(reqs) and flavours.FLAVOURS[13].cudnn in reqs
    no_build_env.setenv("CUDNN_HOME", str(fake_cudnn(tmp_path / "cudnn")))
    assert flavours.FLAVOURS[13].cudnn not in backend.extension_build_requirements()
    assert toolchain.locate_cudnn(13).source == "CUDNN_HOME"
    no_build_env.setattr(toolchain, "local_toolkit", lambda major=None: "/opt/cuda")
    assert backend.extension_build_requirements() == [cutlass.REQUIREMENT]  # the sm_90 kernels' headers
    no_build_env.setenv("RESNET_NATIVE_CUTLASS", "0")
    assert backend.extension_build_requirements() == []


def fake_cutlass(root, version=(4, 2, 0)):
    for rel in ("include/cutlass/conv/collective/collective_builder.hpp",
                "tools/util/include/cutlass/util/packed_stride.hpp"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    (root / "include/cutlass/version.h").write_text(
        "".join(f"#define CUTLASS_{p} {v}\n" for p, v in zip(("MAJOR", "MINOR", "PATCH"), version, strict=True)))
    return root


def test_the_cutlass_kernels_build_only_with_nvcc_sm90_and_cutlass_4_2(no_build_env, tmp_path):
    nvcc = toolchain.CudaToolchain(13, "nvcc", "/opt/cuda/bin/nvcc", [], "/opt/cuda/lib64", "toolkit /opt/cuda")
    no_build_env.setattr(cutlass, "_nvcc_version", lambda tc: (13, 0))
    find = cutlass.find_cutlass
    no_build_env.setattr(cutlass, "find_cutlass", lambda: None)
    assert cutlass.plan(nvcc, ["80", "90"]).reason.startswith("not built: no CUTLASS headers (pip install")
    no_build_env.setattr(cutlass, "find_cutlass", find)
    no_build_env.setenv("CUTLASS_DIR", str(fake_cutlass(tmp_path / "good")))
    plan = cutlass.plan(nvcc, ["80", "90"])
    assert plan.built and plan.reason == "" and plan.cutlass.version_text == "4.2.0"
    assert plan.cutlass.source == "CUTLASS_DIR"
    assert plan.sources and all(cutlass.is_source(s) and s.endswith(".cu") for s in plan.sources)
    flags = cutlass.device_flags(plan.cutlass, ["-O3", "-gencode=arch=compute_80,code=sm_80"])
    assert "-gencode=arch=compute_90a,code=sm_90a" in flags and "-gencode=arch=compute_80,code=sm_80" not in flags
    assert f"-I{tmp_path / 'good' / 'include'}" in flags
    assert "no 90" in cutlass.plan(nvcc, ["80"]).reason
    clang = toolchain.CudaToolchain(12, "clang", "/usr/bin/clang++-19", [], "/lib", "wheels")
    assert "the device compiler is clang" in cutlass.plan(clang, ["80", "90"]).reason
    no_build_env.setattr(cutlass, "_nvcc_version", lambda tc: (11, 8))
    assert "nvcc >= 12.0" in cutlass.plan(nvcc, ["90"]).reason
    no_build_env.setattr(cutlass, "_nvcc_version", lambda tc: (13, 0))
    no_build_env.setenv("CUTLASS_DIR", str(fake_cutlass(tmp_path / "old", (3, 5, 1))))
    assert "CUTLASS 3.5.1" in cutlass.plan(nvcc, ["90"]).reason
    no_build_env.setenv("RESNET_NATIVE_CUTLASS", "1")
    with pytest.raises(SystemExit, match="RESNET_NATIVE_CUTLASS=1 but the own convolution kernels cannot be built"):
        cutlass.plan(nvcc, ["90"])
    no_build_env.setenv("RESNET_NATIVE_CUTLASS", "0")
    assert cutlass.plan(nvcc, ["90"]).reason == "not built: RESNET_NATIVE_CUTLASS=0"
    no_build_env.setenv("RESNET_NATIVE_CUTLASS", "yes")
    with pytest.raises(SystemExit, match="expected auto, 0 or 1"):
        cutlass.plan(nvcc, ["90"])
    no_build_env.setenv("RESNET_NATIVE_CUTLASS", "auto")
    no_build_env.setenv("CUTLASS_DIR", str(tmp_path / "empty"))
    with pytest.raises(SystemExit, match="holds no CUTLASS"):
        cutlass.plan(nvcc, ["90"])


def test_an_isolated_build_asks_for_the_cutlass_wheel_only_where_the_kernels_build(no_build_env):
    no_build_env.setattr(toolchain, "local_toolkit", lambda major=None: "/opt/cuda")
    no_build_env.setattr(toolchain, "_system_cudnn", lambda major: toolchain.Cudnn("/i", "/l", "system"))
    assert cutlass.REQUIREMENT in backend.extension_build_requirements()
    no_build_env.setenv("RESNET_NATIVE_CUDA_ARCHS", "80")
    assert cutlass.REQUIREMENT not in backend.extension_build_requirements()
    no_build_env.setenv("RESNET_NATIVE_CUDA_ARCHS", "80;90")
    no_build_env.setenv("CUTLASS_DIR", "/opt/cutlass")
    assert cutlass.REQUIREMENT not in backend.extension_build_requirements()
    no_build_env.delenv("CUTLASS_DIR")
    no_build_env.setenv("RESNET_NATIVE_CUDA", "12")  # a CUDA 12 build from wheels compiles with clang
    no_build_env.setattr(toolchain, "local_toolkit", lambda major=None: None)
    no_build_env.setattr(toolchain, "find_clang", lambda: ("/usr/bin/clang++-19", 19))
    assert cutlass.REQUIREMENT not in backend.extension_build_requirements()


def test_cudnn_home_without_cudnn_is_refused(no_build_env, tmp_path):
    no_build_env.setenv("CUDNN_HOME", str(tmp_path))
    with pytest.raises(SystemExit, match="holds no cuDNN 9"):
        toolchain.locate_cudnn(13)


def test_cuda12_without_toolkit_or_clang_says_what_to_install(no_build_env):
    no_build_env.setenv("RESNET_NATIVE_CUDA", "12")
    no_build_env.setattr(toolchain, "_local_toolkits", lambda: [])
    no_build_env.setattr(toolchain, "find_clang", lambda: None)
    with pytest.raises(SystemExit) as info:
        backend.extension_build_requirements()
    message = str(info.value)
    assert "CUDA 12 toolkit" in message and "clang >= 19" in message and "nvidia-cuda-nvcc-cu12" in message


def test_fatbinary_stand_in_reads_clangs_command_line():
    out, images, options = fatbinary.parse(["-64", "--create", "x.fatbin", "--image=profile=sm_80,file=a.cubin",
                                            "--image=profile=compute_90,file=b.s"])
    assert out == "x.fatbin" and options == ["-64"]
    assert images == [("cubin", "80", "a.cubin"), ("ptx", "90", "b.s")]
    with pytest.raises(SystemExit, match="unsupported argument '--bogus'"):
        fatbinary.parse(["--bogus"])


# --- the built extension ------------------------------------------------------------------------------------------

def test_build_info_reports_toolkit_cudnn_and_architectures():
    info = rn.build_info()
    assert info["cuda_flavour"] in (12, 13)
    assert info["cudart_version"] // 1000 == info["cuda_flavour"]
    assert re.fullmatch(r"(nvcc|clang) \d+\.\d+\.\d+(, ptxas \d+\.\d+\.\d+)?", info["cuda_compiler"])
    assert info["cuda_archs"] and all(re.fullmatch(r"\d{2,3}[af]?", a) for a in info["cuda_archs"])
    assert info["ptx_arch"] == info["cuda_archs"][-1]
    assert info["cudnn_headers_version"] // 10000 == 9 and info["cudnn_loaded_version"] == rn.cudnn_version()
    assert info["cudnn_source"] in ("wheel", "CUDNN_HOME", "system")
    assert isinstance(info["debug_info"], bool) and isinstance(info["driver_cuda_version"], int)
    assert all(name.startswith("cupy") for name in info["cupy"])


def elf_section_names(path):
    """Section names of a 64-bit little-endian ELF file."""
    data = pathlib.Path(path).read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    def header(i):
        return struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
    strtab_offset = header(shstrndx)[4]
    names = []
    for i in range(shnum):
        start = strtab_offset + header(i)[0]
        names.append(data[start:data.index(b"\0", start)].decode())
    return names


def test_extension_carries_no_host_debug_info_by_default():
    if rn.build_info()["debug_info"]:
        pytest.skip("built with RESNET_NATIVE_DEBUG_INFO=1")
    names = elf_section_names(rn._C.__file__)
    assert ".nv_fatbin" in names and ".text" in names  # the parser reads real sections
    assert not [n for n in names if n.startswith(".debug")]


def run_python(code, cwd, env=None):
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=env)


def installed_editable() -> bool:
    """Whether resnet_native is installed in editable mode (pip install -e .): its import hook then serves every
    `import resnet_native`, and no source tree can shadow it."""
    # Every distribution of that name: run from a checkout, the editable build's resnet_native.egg-info (which has no
    # direct_url.json) is found before the installed one.
    for dist in importlib.metadata.distributions(name="resnet_native"):
        direct_url = dist.read_text("direct_url.json")
        if direct_url and json.loads(direct_url).get("dir_info", {}).get("editable", False):
            return True
    return False


def test_source_tree_without_extension_explains_the_shadowing(tmp_path):
    if installed_editable():
        pytest.skip("resnet_native is installed in editable mode: its import hook wins over any source tree")
    tree = tmp_path / "checkout"
    shutil.copytree(REPO / "resnet_native", tree / "resnet_native",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    (tree / "pyproject.toml").write_text("")
    result = run_python("import resnet_native", cwd=tree)
    assert result.returncode != 0
    assert "ImportError: resnet_native was imported from its source tree" in result.stderr
    assert "shadows the installed package" in result.stderr and "pip install -e ." in result.stderr
    assert "circular import" not in result.stderr.splitlines()[-1]


def test_missing_cudnn_names_the_install_command(tmp_path):
    # A copy of the package whose rpath ($ORIGIN/../nvidia/cudnn/lib) finds nothing, with the cuDNN wheel hidden.
    shutil.copytree(pathlib.Path(rn.__file__).parent, tmp_path / "resnet_native",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("CUDNN_HOME", "LD_LIBRARY_PATH", "PYTHONPATH")}
    result = run_python("import sys; sys.modules['nvidia.cudnn'] = None; import resnet_native", tmp_path, env)
    if result.returncode == 0:
        pytest.skip("a system cuDNN 9 is on the dynamic loader's path")
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: resnet_native needs cuDNN 9, which was not found")
    assert "pip install" in last and "nvidia-cudnn-cu1" in last and "CUDNN_HOME" in last


@pytest.mark.skipif(rn.cuda_available(), reason="the summary line is printed where GPU tests skip")
def test_gpu_skips_are_summarised_once_under_q(tmp_path):
    # Run from elsewhere, with the resnet_native this test imported first on the path (installed or in-place).
    from conftest import child_env

    env = child_env()
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(REPO / "tests" / "test_pool_gpu.py")], cwd=tmp_path, capture_output=True, text=True,
                            timeout=300, env=env)
    lines = [line for line in result.stdout.splitlines() if "tests skipped: no CUDA GPU or driver" in line]
    assert len(lines) == 1 and re.fullmatch(r"\d+ tests skipped: no CUDA GPU or driver.*", lines[0]), result.stdout


# --- declared dependencies ----------------------------------------------------------------------------------------

IMPORT_TO_DIST = {"yaml": "pyyaml", "PIL": "pillow", "nvidia": "nvidia-cudnn", "cupyx": "cupy", "cupy_backends": "cupy"}


def third_party_imports(root):
    """{top-level module: guarded?} for every import of a module that is neither stdlib nor the package's own."""
    found = {}
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        guarded = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.Try)
                   for sub in ast.walk(node) if isinstance(sub, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "resnet_native":
                    found[top] = found.get(top, True) and id(node) in guarded
    return found


@pytest.mark.parametrize("major", [12, 13])
def test_every_import_of_the_package_is_a_dependency_or_an_extra(major):
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    required = [re.split(r"[<>=!~\[; ]", r)[0].lower()
                for r in flavours.runtime_requirements(flavours.FLAVOURS[major], cudnn_from_wheel=True)]
    extras = [re.split(r"[<>=!~\[; ]", r)[0].lower() for reqs in meta["optional-dependencies"].values()
              for r in reqs]
    for module, guarded in third_party_imports(REPO / "resnet_native").items():
        dist = IMPORT_TO_DIST.get(module, module).lower().replace("_", "-")
        if any(r.startswith(dist) for r in required):
            continue
        assert guarded and any(e.startswith(dist) for e in extras), f"{module}: not a dependency nor an extra's"


def test_package_data_exists_and_py_typed_is_not_claimed():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = meta["tool"]["setuptools"]["package-data"]["resnet_native"]
    assert all(list((REPO / "resnet_native").glob(p)) for p in patterns)
    # The package is only partly annotated and its native core has no stubs: it makes no py.typed promise.
    assert "py.typed" not in patterns and not (REPO / "resnet_native" / "py.typed").exists()
