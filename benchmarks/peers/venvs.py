"""Virtual environments of the frameworks we compare with: made by the benchmark, never
installed into ours.

``ensure(name, root)`` returns the Python of ``root/name``, creating the environment with
its recipe when it is missing or broken (a working one is reused: ``--venvs DIR``). The
recipes are what it takes on this kind of machine:

* **hivemind 1.1.12**: torch 2.13.0 first (the CPU build; an unpinned torch resolves to a
  CUDA one), then hivemind (its wheel ships the libp2p daemon).
* **p2pfl 0.4.4**: torch 2.13.0 first; p2pfl with what its ``torch`` extra asks
  (lightning, torchmetrics) except torchvision; ``opendp`` (imported at start-up),
  ``huggingface_hub<1`` and ``pyarrow<20`` (newer ones break its ``datasets`` pin); no
  torchvision (PyPI's wheel does not load beside the CPU torch; p2pfl imports it only for
  its own example datasets, which the driver does not use): the driver stubs that import
  in ``sys.modules``, not on disk, because torchmetrics imports torchvision's submodules
  whenever ``find_spec`` finds a ``torchvision``, so a stub package breaks ``import
  lightning``. Ray is switched off in the driver
  through p2pfl's settings, before p2pfl's logger (which starts Ray on import) is imported.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import venv
from dataclasses import dataclass
from pathlib import Path

TORCH = "torch==2.13.0"


@dataclass(frozen=True)
class Recipe:
    name: str
    check: str  # a Python statement that succeeds in a working environment
    packages: tuple[tuple[str, ...], ...]  # pip installs, in order


RECIPES = {
    "hivemind": Recipe(
        "hivemind",
        "import hivemind, torch, numpy; assert hivemind.__version__ == '1.1.12'",
        ((TORCH,), ("hivemind==1.1.12", "numpy")),
    ),
    "p2pfl": Recipe(
        "p2pfl",
        "import p2pfl.node, lightning, torchmetrics, torch, numpy, importlib.metadata as m; "
        "assert m.version('p2pfl') == '0.4.4'",
        (
            (TORCH,),
            # p2pfl[torch] without its torchvision pin; lightning as that extra asks.
            (
                "p2pfl==0.4.4",
                "lightning>=2.4,<3",
                "torchmetrics>=1.3.1,<2",
                "opendp",
                "huggingface_hub<1",
                "pyarrow<20",
                "numpy",
            ),
        ),
    ),
}


class VenvError(RuntimeError):
    """An environment that could not be made; the message says which step failed."""


def python_of(root: Path, name: str) -> Path:
    return root / name / "bin" / "python"


def works(python: Path, recipe: Recipe) -> bool:
    if not python.exists():
        return False
    # in a folder of its own: importing p2pfl writes logs/run-N.log into the working folder
    with tempfile.TemporaryDirectory(prefix="airgossip-venv-check-") as folder:
        done = subprocess.run(
            [str(python), "-c", recipe.check], capture_output=True, timeout=300, check=False,
            cwd=folder,
        )  # fmt: skip
    return done.returncode == 0


def ensure(name: str, root: Path, log: Path) -> Path:
    """The Python of a working environment ``root/name``; made (logging to ``log``) when
    missing or broken."""
    recipe = RECIPES[name]
    python = python_of(root, name)
    if works(python, recipe):
        return python
    print(f"  making the {name} environment in {root / name} (minutes; log {log})", flush=True)
    venv.EnvBuilder(with_pip=True, clear=True).create(root / name)
    with log.open("ab") as handle:
        for packages in recipe.packages:
            done = subprocess.run(
                [str(python), "-m", "pip", "install", "--quiet", *packages],
                stdout=handle,
                stderr=subprocess.STDOUT,
                check=False,
            )
            if done.returncode != 0:
                raise VenvError(f"pip install {' '.join(packages)} failed in {root / name}")
    if not works(python, recipe):
        raise VenvError(f"the {name} environment in {root / name} does not import {name}")
    return python


if __name__ == "__main__":  # python -m benchmarks.peers.venvs DIR: make both
    for each in RECIPES:
        print(ensure(each, Path(sys.argv[1]), Path(sys.argv[1]) / f"{each}.log"))
