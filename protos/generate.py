"""Regenerate the checked-in protobuf and gRPC code from ``protos/*.proto``.

Run ``python -m airgossip.protos.generate`` from the repository root after editing a ``.proto``
file.
``tests/test_protos.py`` regenerates into a temporary folder and fails on any difference.
It needs the dev extras: ``grpcio-tools==1.81.1`` (the newest that works with protobuf 6,
which flwr 1.42 requires) and ``mypy-protobuf`` for the type stubs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROTO_DIR.parent
#: Where the protos are installed, as a path: the generated imports' package.
PACKAGE = "airgossip/protos"


def _plugin(folder: Path, name: str, entry: str) -> Path:
    """Write an executable protoc plugin that runs mypy-protobuf with this interpreter."""
    path = folder / name
    path.write_text(f"#!{sys.executable}\nfrom mypy_protobuf.main import {entry}\n{entry}()\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def generate(out_root: Path) -> list[Path]:
    """Generate code for every ``protos/*.proto`` under ``out_root/protos``.

    Parameters
    ----------
    out_root:
        Folder standing in for the repository root; the code lands in ``out_root/protos``.

    Returns
    -------
    list[Path]
        The generated files.
    """
    from grpc_tools import protoc  # dev dependency: imported only when generating

    (out_root / "protos").mkdir(parents=True, exist_ok=True)
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        # The .proto files are compiled where they are installed (airgossip/protos/), so that
        # the generated code imports its siblings as ``airgossip.protos``.
        source = Path(tmp) / "source"
        (source / PACKAGE).mkdir(parents=True)
        for proto in PROTO_DIR.glob("*.proto"):
            shutil.copy(proto, source / PACKAGE / proto.name)
        out = Path(tmp) / "out"
        out.mkdir()
        mypy = _plugin(Path(tmp), "protoc-gen-mypy", "main")
        mypy_grpc = _plugin(Path(tmp), "protoc-gen-mypy_grpc", "grpc")
        args = [
            "grpc_tools.protoc",
            f"-I{source}",
            f"-I{include}",
            f"--plugin=protoc-gen-mypy={mypy}",
            f"--plugin=protoc-gen-mypy_grpc={mypy_grpc}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            f"--mypy_out={out}",
            f"--mypy_grpc_out={out}",
            *sorted(f"{PACKAGE}/{p.name}" for p in PROTO_DIR.glob("*.proto")),
        ]
        code = protoc.main(args)
        if code != 0:
            raise RuntimeError(f"protoc failed with exit code {code}")
        for path in (out / PACKAGE).glob("*_pb2*.py*"):
            shutil.copy(path, out_root / "protos" / path.name)
    return sorted((out_root / "protos").glob("*_pb2*.py*"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT, help="root to write protos/ under")
    args = parser.parse_args()
    for path in generate(args.out):
        print(path)


if __name__ == "__main__":
    main()
