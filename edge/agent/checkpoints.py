"""Crash-safe checkpoints of an agent: written atomically, checked before use.

A checkpoint is one file holding a nested state (numbers, strings, tensors, bytes): a JSON
skeleton, the raw tensor and byte blobs, and a SHA-256 of everything before it. It is
written to a temporary file, flushed and fsynced, renamed into place and the folder fsynced,
so a crash at any moment leaves either the previous checkpoint or the new one, never half of
one. On load the newest file whose checksum holds wins; a corrupt one is reported with a
clear message and the one before it is used. The newest few are kept.

Nothing here knows what an agent keeps: :class:`~edge.agent.Agent` builds the state, the
algorithms fill in theirs (``GossipAlgorithm.state_dict``).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

MAGIC = b"AIRGOSSIP-CHECKPOINT 1\n"
SUFFIX = ".ckpt"
_LENGTH = struct.Struct("<Q")
_DIGEST_BYTES = 32


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (corrupt, truncated, or another agent's)."""


#: The tensor types a checkpoint may hold, by the name it stores.
DTYPES = {
    str(t).removeprefix("torch."): t
    for t in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
              torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
}  # fmt: skip


def _dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise TypeError(f"cannot checkpoint a tensor of {dtype}")
    return name


def encode_state(state: dict[str, Any]) -> bytes:
    """``state`` as checkpoint bytes (see the module docstring)."""
    blobs: list[bytes] = []

    def skeleton(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            array = value.detach().to("cpu").contiguous()
            blobs.append(array.reshape(-1).view(torch.uint8).numpy().tobytes())
            return {
                "__tensor__": len(blobs) - 1,
                "dtype": _dtype_name(array.dtype),
                "shape": list(array.shape),
            }
        if isinstance(value, bytes | bytearray | memoryview):
            blobs.append(bytes(value))
            return {"__bytes__": len(blobs) - 1}
        if isinstance(value, dict):
            return {str(k): skeleton(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [skeleton(v) for v in value]
        if value is None or isinstance(value, bool | int | float | str):
            return value
        raise TypeError(f"cannot checkpoint a {type(value).__name__}")

    head = json.dumps(
        {"state": skeleton(state), "blobs": [len(b) for b in blobs]}, allow_nan=False
    ).encode()
    body = b"".join([MAGIC, _LENGTH.pack(len(head)), head, *blobs])
    return body + hashlib.sha256(body).digest()


def decode_state(data: bytes) -> dict[str, Any]:
    """The state in checkpoint bytes; :class:`CheckpointError` if they are not intact."""
    if not data.startswith(MAGIC):
        raise CheckpointError("not an airgossip checkpoint")
    if len(data) < len(MAGIC) + _LENGTH.size + _DIGEST_BYTES:
        raise CheckpointError("truncated")
    body, digest = data[:-_DIGEST_BYTES], data[-_DIGEST_BYTES:]
    if hashlib.sha256(body).digest() != digest:
        raise CheckpointError("checksum mismatch (the file is corrupt or truncated)")
    (length,) = _LENGTH.unpack_from(body, len(MAGIC))
    start = len(MAGIC) + _LENGTH.size
    try:
        head = json.loads(body[start : start + length])
    except ValueError:
        raise CheckpointError("unreadable header") from None
    offsets, position = [], start + length
    for size in head["blobs"]:
        offsets.append((position, position + size))
        position += size
    if position != len(body):
        raise CheckpointError("blob sizes do not add up")

    def value(node: Any) -> Any:
        if isinstance(node, dict):
            if "__tensor__" in node:
                begin, end = offsets[node["__tensor__"]]
                dtype = DTYPES[node["dtype"]]
                if end == begin:
                    return torch.zeros(node["shape"], dtype=dtype)
                raw = np.frombuffer(body, dtype=np.uint8, count=end - begin, offset=begin)
                flat = torch.from_numpy(raw.copy()).view(dtype)
                return flat.reshape(node["shape"])
            if "__bytes__" in node:
                begin, end = offsets[node["__bytes__"]]
                return bytes(body[begin:end])
            return {k: value(v) for k, v in node.items()}
        if isinstance(node, list):
            return [value(v) for v in node]
        return node

    try:
        state = value(head["state"])
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"inconsistent contents ({err})") from None
    if not isinstance(state, dict):
        raise CheckpointError("the state is not a mapping")
    return state


@dataclass(frozen=True)
class Loaded:
    """What :meth:`CheckpointStore.load_latest` found."""

    state: dict[str, Any]
    path: Path
    #: One line per newer checkpoint that could not be used, and why.
    skipped: tuple[str, ...] = ()


class CheckpointStore:
    """The checkpoints of one agent in one folder.

    Parameters
    ----------
    directory:
        Where they live (created if needed). A checkpoint holds the agent's model: the folder
        is made private (0700) and every file is 0600.
    agent_id:
        Names the files (``<agent_id>-<serial>.ckpt``), so agents may share a folder.
    keep:
        How many of the newest to keep (at least 2: the previous one is the fallback).
    """

    def __init__(self, directory: Path, agent_id: str, *, keep: int = 3) -> None:
        if keep < 2:
            raise ValueError(f"keep at least 2 checkpoints (the fallback), not {keep}")
        self.directory = directory
        self.agent_id = agent_id
        self.keep = keep
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.directory.stat().st_mode & 0o077:
            self.directory.chmod(0o700)  # an existing folder others could read
        existing = self.paths()
        self._serial = self._serial_of(existing[-1]) if existing else 0

    def _serial_of(self, path: Path) -> int:
        return int(path.name[len(self.agent_id) + 1 : -len(SUFFIX)])

    def paths(self) -> list[Path]:
        """This agent's checkpoint files, oldest first."""
        prefix = f"{self.agent_id}-"
        found = []
        for path in self.directory.glob(f"{prefix}*{SUFFIX}"):
            serial = path.name[len(prefix) : -len(SUFFIX)]
            if serial.isdigit():
                found.append((int(serial), path))
        return [path for _, path in sorted(found)]

    def save(self, state: dict[str, Any]) -> Path:
        """Write ``state`` as the newest checkpoint, atomically and durably; return its path."""
        data = encode_state(state)
        self._serial += 1
        path = self.directory / f"{self.agent_id}-{self._serial:09d}{SUFFIX}"
        tmp = self.directory / f".{path.name}.tmp"
        tmp.unlink(missing_ok=True)  # left by a crash mid-write
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        folder = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(folder)  # the rename itself survives a power cut
        finally:
            os.close(folder)
        for old in self.paths()[: -self.keep]:
            old.unlink(missing_ok=True)
        return path

    def load_latest(self) -> Loaded | None:
        """The newest intact checkpoint (None if there is none at all).

        Raises
        ------
        CheckpointError
            Checkpoints exist but none is intact (each one's problem is in the message).
        """
        skipped: list[str] = []
        for path in reversed(self.paths()):
            try:
                state = decode_state(path.read_bytes())
            except (OSError, CheckpointError, KeyError, TypeError, ValueError) as err:
                skipped.append(f"checkpoint {path} is unusable: {err}")
                continue
            return Loaded(state, path, tuple(skipped))
        if skipped:
            raise CheckpointError("; ".join(skipped) + "; no intact checkpoint is left")
        return None
