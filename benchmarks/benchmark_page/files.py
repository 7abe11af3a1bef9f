"""Where the raw results lie and which is newest."""

import glob
import json
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "lab-notes" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"
RECIPES = ROOT / "resnet_native" / "recipes"


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
    return sorted(files, key=lambda p: (folder_key(results_folder(p)), call_number(p), p.name, str(p)), reverse=True)


def rel(path):
    return path.relative_to(ROOT).as_posix()


def load(path):
    return json.loads(path.read_text())
