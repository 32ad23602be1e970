"""The checked-in generated code is exactly what the .proto files produce."""

from __future__ import annotations

from pathlib import Path

import pytest

from airgossip.protos.generate import PROTO_DIR, generate


def test_generated_code_is_up_to_date(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="needs the dev extras (grpcio-tools)")
    pytest.importorskip("mypy_protobuf", reason="needs the dev extras (mypy-protobuf)")
    generated = generate(tmp_path)
    assert generated, "nothing was generated"
    stale = [
        path.name
        for path in generated
        if not (PROTO_DIR / path.name).exists()
        or (PROTO_DIR / path.name).read_text() != path.read_text()
    ]
    checked_in = {p.name for p in PROTO_DIR.glob("*_pb2*.py*")}
    extra = checked_in - {p.name for p in generated}
    assert not stale, f"regenerate with `python -m airgossip.protos.generate`: {stale} differ"
    assert not extra, f"checked-in files without a .proto: {sorted(extra)}"
