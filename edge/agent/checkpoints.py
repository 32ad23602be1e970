"""Crash-safe checkpoints of an agent: written atomically, bound to their run, checked
before use.

A checkpoint is one file (format 2)::

    MAGIC  u64 header length  header (JSON)  blobs  SHA-256(body)  HMAC-SHA256(key, body)

where ``body`` is everything before the two digests. The header names the checkpoint's
:class:`CheckpointOwner` (fleet, run, agent) and holds the state's skeleton (numbers,
strings, and where each tensor and byte blob lies). The SHA-256 tells a corrupt or truncated
file; the HMAC tells one written under another key or altered since. The key
(:class:`CheckpointKey`) is derived from the agent's TLS private key (HKDF-SHA256 with a fixed
label), so only a holder of that key can write a checkpoint the agent accepts. Over plaintext
(``--insecure``) there is no secret: the MAC is then keyed with a public constant and proves
nothing more than the SHA-256 (anyone who can write the folder can write a checkpoint the
agent takes, values and owner included).

A file is written to a temporary file, flushed and fsynced, renamed into place and the
folder fsynced, so a crash at any moment leaves either the previous checkpoint or the new
one, never half of one. On load the newest file that is intact, verifies, and belongs to this
fleet, run and agent wins (and whatever the caller checks besides: the values); every newer
one is refused with one line saying why, and none usable means the agent starts fresh. The
newest few are kept.

Nothing here knows what an agent keeps: :class:`~airgossip.edge.agent.Agent` builds the state, the
algorithms fill in theirs (``GossipAlgorithm.state_dict``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias

import numpy as np
import torch

from airgossip.edge.algorithms.state import StateValue

#: What a checkpoint holds: named parts, each a tensor, bytes, a number, a string, None, or
#: lists and string-keyed tables of these (a tuple written reads back as a list).
CheckpointState: TypeAlias = dict[str, StateValue]

MAGIC = b"AIRGOSSIP-CHECKPOINT 2\n"
#: Earlier formats, refused with a line that says so (format 1: a SHA-256 only, no owner).
OLD_MAGICS = {b"AIRGOSSIP-CHECKPOINT 1\n": 1}
SUFFIX = ".ckpt"
_LENGTH = struct.Struct("<Q")
_DIGEST_BYTES = 32
#: The HKDF label of the checkpoint MAC key: a key derived for nothing else.
KEY_LABEL = b"airgossip checkpoint mac v2"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (corrupt, truncated, altered, another run's or
    agent's, or holding values no agent could hold)."""


@dataclass(frozen=True)
class CheckpointOwner:
    """Whose checkpoint it is.

    Attributes
    ----------
    agent:
        The agent's id.
    fleet:
        The fleet: the fingerprint of its CA certificate
        (:func:`airgossip.common.security.tls.fleet_of`; empty over plaintext).
    run:
        The run: the coordinator's run id, or for static peers the run the operator names
        (``--run-id``) or else a digest of the run's settings and peer list.
    """

    agent: str
    fleet: str = ""
    run: str = ""

    def mismatch(self, other: CheckpointOwner) -> str | None:
        """Why a checkpoint owned by ``other`` is not this owner's (None: it is)."""
        if other.agent != self.agent:
            return f"it is {other.agent[:64]!r}'s checkpoint, not {self.agent!r}'s"
        if other.fleet != self.fleet:
            return (
                f"it is of fleet {other.fleet[:64] or '(plaintext)'!r} (another CA), not of "
                f"this agent's fleet {self.fleet or '(plaintext)'!r}"
            )
        if other.run != self.run:
            return f"it is of run {other.run[:64]!r}, not of this run {self.run!r}"
        return None


@dataclass(frozen=True)
class CheckpointKey:
    """The key of a checkpoint's MAC.

    Build with :meth:`of_private_key` (a secret only the agent holds) or use :data:`UNKEYED`
    (plaintext: an integrity check only).
    """

    secret: bytes = field(repr=False)
    #: Whether the secret is one (derived from the agent's private key): only then does a
    #: MAC that verifies prove that the agent wrote the file.
    authenticates: bool

    @classmethod
    def of_private_key(cls, key_pem: bytes) -> CheckpointKey:
        """The key derived from a PEM private key: HKDF-SHA256 over its PKCS#8 DER bytes
        (whatever PEM spelling they came in) with the label :data:`KEY_LABEL`."""
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF

        key = serialization.load_pem_private_key(key_pem, password=None)
        der = key.private_bytes(
            serialization.Encoding.DER,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=KEY_LABEL)
        return cls(hkdf.derive(der), authenticates=True)

    def mac(self, body: bytes) -> bytes:
        return hmac.new(self.secret, body, hashlib.sha256).digest()


#: The key of an agent without a private key (plaintext): public, so its MAC only tells
#: accidents (like the SHA-256), never a forgery.
UNKEYED = CheckpointKey(b"airgossip checkpoint without a key", authenticates=False)

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


def encode_state(
    state: CheckpointState,
    owner: CheckpointOwner | None = None,
    key: CheckpointKey = UNKEYED,
) -> bytes:
    """``state`` as checkpoint bytes owned by ``owner`` under ``key`` (see the module
    docstring; no owner: an unnamed agent of no fleet or run, for tools and tests)."""
    blobs: list[bytes] = []

    def skeleton(value: StateValue) -> object:
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

    owner = owner or CheckpointOwner("")
    head = json.dumps(
        {
            "owner": {"agent": owner.agent, "fleet": owner.fleet, "run": owner.run},
            "keyed": key.authenticates,
            "state": skeleton(state),
            "blobs": [len(b) for b in blobs],
        },
        allow_nan=False,  # a NaN or infinity in the state is a bug: never written
    ).encode()
    body = b"".join([MAGIC, _LENGTH.pack(len(head)), head, *blobs])
    return body + hashlib.sha256(body).digest() + key.mac(body)


def read_checkpoint(
    data: bytes, key: CheckpointKey = UNKEYED, owner: CheckpointOwner | None = None
) -> CheckpointState:
    """The state in checkpoint bytes, once they proved intact, owned by ``owner`` (None:
    anyone's) and written under ``key``; :class:`CheckpointError` saying why not."""
    if not data.startswith(MAGIC):
        for magic, version in OLD_MAGICS.items():
            if data.startswith(magic):
                raise CheckpointError(
                    f"it is in checkpoint format {version} (not bound to its run, no MAC), "
                    "which this airgossip no longer takes; remove it to start fresh"
                )
        raise CheckpointError("not an airgossip checkpoint")
    if len(data) < len(MAGIC) + _LENGTH.size + 2 * _DIGEST_BYTES:
        raise CheckpointError("truncated")
    body = data[: -2 * _DIGEST_BYTES]
    digest, mac = data[-2 * _DIGEST_BYTES : -_DIGEST_BYTES], data[-_DIGEST_BYTES:]
    if not hmac.compare_digest(hashlib.sha256(body).digest(), digest):
        raise CheckpointError("checksum mismatch (the file is corrupt or truncated)")
    (length,) = _LENGTH.unpack_from(body, len(MAGIC))
    start = len(MAGIC) + _LENGTH.size
    try:
        head = json.loads(body[start : start + length])
        named = head["owner"]
        written_by = CheckpointOwner(str(named["agent"]), str(named["fleet"]), str(named["run"]))
        keyed = bool(head["keyed"])
    except (ValueError, KeyError, TypeError):
        raise CheckpointError("unreadable header") from None
    # The owner is read before the MAC is checked only to say whose file it is: a file is
    # refused for naming another owner, never accepted for naming this one unless it verifies.
    if owner is not None:
        why = owner.mismatch(written_by)
        if why is not None:
            raise CheckpointError(why)
    if not hmac.compare_digest(key.mac(body), mac):
        raise CheckpointError(_mac_mismatch(keyed, key))
    return _state_of(head, body, start + length)


def _mac_mismatch(keyed: bool, key: CheckpointKey) -> str:
    if keyed and not key.authenticates:
        return "its MAC is under a TLS key and this agent runs without one (--insecure)"
    if not keyed and key.authenticates:
        return (
            "it was written without a TLS key (--insecure), and this agent takes only "
            "checkpoints MACed under its own key"
        )
    return (
        "its MAC does not verify under this agent's key: written with other credentials, or "
        "altered after it was written"
    )


def _state_of(head: Mapping[str, object], body: bytes, position: int) -> CheckpointState:
    sizes = head.get("blobs")
    if not isinstance(sizes, list) or not all(
        isinstance(size, int) and not isinstance(size, bool) and size >= 0 for size in sizes
    ):
        raise CheckpointError("unreadable header")
    offsets = []
    for size in sizes:
        offsets.append((position, position + size))
        position += size
    if position != len(body):
        raise CheckpointError("blob sizes do not add up")

    def value(node: object) -> StateValue:
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
        if node is None or isinstance(node, bool | int | float | str):
            return node
        raise TypeError(f"a {type(node).__name__} where a value belongs")

    try:
        state = value(head["state"])
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as err:
        raise CheckpointError(f"inconsistent contents ({err})") from None
    if not isinstance(state, dict):
        raise CheckpointError("the state is not a mapping")
    return state


def decode_state(data: bytes, key: CheckpointKey = UNKEYED) -> CheckpointState:
    """The state in checkpoint bytes written under ``key``, whoever owns them
    (:func:`read_checkpoint`)."""
    return read_checkpoint(data, key)


@dataclass(frozen=True)
class Loaded:
    """What :meth:`CheckpointStore.load_latest` found."""

    #: The newest usable checkpoint's state (None: none is usable; start fresh).
    state: CheckpointState | None
    #: Its file (None with no state).
    path: Path | None
    #: One line per newer checkpoint refused: the file and why.
    refused: tuple[str, ...] = ()


class CheckpointStore:
    """The checkpoints of one agent in one folder.

    Parameters
    ----------
    directory:
        Where they live (created if needed). A checkpoint holds the agent's model: the folder
        is made private (0700) and every file is 0600.
    agent_id:
        Names the files (``<agent_id>-<serial>.ckpt``), so agents may share a folder.
    owner:
        The fleet, run and agent whose checkpoints it writes and takes (default: ``agent_id``
        of no fleet or run); a checkpoint of any other is refused.
    key:
        The MAC key (:meth:`CheckpointKey.of_private_key`; default :data:`UNKEYED`).
    keep:
        How many of the newest to keep (at least 2: the previous one is the fallback).
    """

    def __init__(
        self,
        directory: Path,
        agent_id: str,
        *,
        owner: CheckpointOwner | None = None,
        key: CheckpointKey = UNKEYED,
        keep: int = 3,
    ) -> None:
        if keep < 2:
            raise ValueError(f"keep at least 2 checkpoints (the fallback), not {keep}")
        if owner is not None and owner.agent != agent_id:
            raise ValueError(f"checkpoints of {agent_id!r} cannot be owned by {owner.agent!r}")
        self.directory = directory
        self.agent_id = agent_id
        self.owner = owner or CheckpointOwner(agent_id)
        self.key = key
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

    def save(self, state: CheckpointState) -> Path:
        """Write ``state`` as the newest checkpoint, atomically and durably; return its path."""
        data = encode_state(state, self.owner, self.key)
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

    def load_latest(self, accept: Callable[[CheckpointState, Path], None] | None = None) -> Loaded:
        """The newest checkpoint that is intact, verifies under :attr:`key`, belongs to
        :attr:`owner` and that ``accept`` takes (it raises :class:`CheckpointError` saying
        why not); every newer one is in :attr:`Loaded.refused`. ``Loaded.state`` is None
        when none is usable (or there are none)."""
        refused: list[str] = []
        for path in reversed(self.paths()):
            try:
                state = read_checkpoint(path.read_bytes(), self.key, self.owner)
                if accept is not None:
                    accept(state, path)
            except OSError as err:
                refused.append(f"checkpoint {path} refused: unreadable ({err.strerror})")
                continue
            except CheckpointError as err:
                refused.append(f"checkpoint {path} refused: {err}")
                continue
            return Loaded(state, path, tuple(refused))
        return Loaded(None, None, tuple(refused))
