"""examples/team-package: a team's own code as a pip package, installed FROM the trainer image by its Containerfile.
Here its COPY lines and its pip install run as written, into a target folder instead of the image's Python, and
the class that examples/team-package.yaml names imports from there and is a LightningModule (the e2e's user-image
scenario builds the image itself)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CONTAINERFILE = (EXAMPLES / "team-package" / "Containerfile").read_text()
LEFT_BY_A_LOCAL_BUILD = shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
JOB = yaml.safe_load((EXAMPLES / "team-package.yaml").read_text())
# Run with the folder the package was installed to first on the path: the class and lit_model come from there.
CHECK = """
import importlib, json, sys
import pytorch_lightning as pl
target, class_path, init_args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
module, name = class_path.rsplit(".", 1)
cls = getattr(importlib.import_module(module), name)
assert issubclass(cls, pl.LightningModule), cls.__mro__
assert sys.modules["lit_model"].__file__.startswith(target), sys.modules["lit_model"].__file__
cls(**init_args)
"""


def copied_as_the_containerfile_copies(root: Path) -> list[str]:
    """The Containerfile's COPY lines carried out with `root` as the image's /, and its pip install's arguments
    with the paths under `root`."""
    copies = re.findall(r"^COPY (\S+) /(\S+)$", CONTAINERFILE, re.MULTILINE)
    assert copies, "the Containerfile copies nothing"
    for source, destination in copies:
        if (EXAMPLES / source).is_dir():
            shutil.copytree(EXAMPLES / source, root / destination, ignore=LEFT_BY_A_LOCAL_BUILD)
        else:
            shutil.copyfile(EXAMPLES / source, root / destination)
    (command,) = re.findall(r"^RUN pip (install [^\n\\]*?) *\\?$", CONTAINERFILE, re.MULTILINE)
    arguments = [argument.replace("/src/", f"{root}/src/", 1) for argument in command.split()]
    assert arguments[-1] == f"{root}/src/team-package", arguments
    return arguments


def test_the_package_installs_as_the_containerfile_installs_it_and_trains_the_jobs_class(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    arguments = copied_as_the_containerfile_copies(tmp_path)
    assert "--no-deps" in arguments and "--no-build-isolation" in arguments  # nothing downloaded at build time
    target = tmp_path / "site-packages"
    install = subprocess.run([sys.executable, "-m", "pip", *arguments, "--quiet", "--target", str(target)],
                             capture_output=True, text=True, timeout=120, check=False)
    assert install.returncode == 0, install.stderr
    model = JOB["spec"]["model"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}
    check = subprocess.run([sys.executable, "-c", CHECK, str(target), model["classPath"], json.dumps(model["initArgs"])],
                           cwd=target, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert check.returncode == 0, check.stderr


def test_the_job_runs_the_image_the_containerfile_says() -> None:
    assert JOB["spec"]["image"] in CONTAINERFILE
    assert JOB["spec"]["model"]["classPath"] in CONTAINERFILE
