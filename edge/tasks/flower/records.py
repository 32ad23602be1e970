"""A Flower app's model as one flat vector, and back.

Gossip works on one flat float32 vector; a Flower app speaks in named arrays (an
``ArrayRecord`` of a ``state_dict``, or the legacy list of ndarrays). :class:`ModelLayout`
holds the names, shapes and dtypes of the model the app started from, turns arrays into
the flat vector and back, and says what is wrong with arrays that do not fit it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Array, ArrayRecord


@dataclass(frozen=True)
class ArraySpec:
    """One named array of the model."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def describe(self) -> str:
        return f"{self.shape} {self.dtype}"


@dataclass(frozen=True)
class ModelLayout:
    """Names, shapes and dtypes of a model's arrays, in the app's order."""

    arrays: tuple[ArraySpec, ...]

    @classmethod
    def of(cls, names: Sequence[str], ndarrays: Sequence[np.ndarray]) -> ModelLayout:
        return cls(
            tuple(
                ArraySpec(n, tuple(int(d) for d in a.shape), a.dtype)
                for n, a in zip(names, ndarrays, strict=True)
            )
        )

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.arrays]

    @property
    def numel(self) -> int:
        return sum(a.numel for a in self.arrays)

    def mismatch(self, names: Sequence[str], ndarrays: Sequence[np.ndarray]) -> str | None:
        """What makes ``ndarrays`` (named ``names``) differ from this model, or None."""
        if list(names) != self.names:
            missing = [n for n in self.names if n not in names]
            extra = [n for n in names if n not in self.names]
            if not missing and not extra:
                return f"arrays in another order ({', '.join(names)})"
            parts = []
            if missing:
                parts.append(f"missing {', '.join(map(repr, missing))}")
            if extra:
                parts.append(f"unexpected {', '.join(map(repr, extra))}")
            return "arrays that are not the model's: " + "; ".join(parts)
        for spec, array in zip(self.arrays, ndarrays, strict=True):
            got = ArraySpec(spec.name, tuple(int(d) for d in array.shape), array.dtype)
            if got.shape != spec.shape:
                return f"array '{spec.name}' of shape {got.shape}, the model's is {spec.shape}"
            if got.dtype != spec.dtype:
                return f"array '{spec.name}' of dtype {got.dtype}, the model's is {spec.dtype}"
            if array.dtype.kind in "fc" and not np.isfinite(array).all():
                return f"array '{spec.name}' holding NaN or infinity"
        return None

    def flatten(self, ndarrays: Sequence[np.ndarray]) -> torch.Tensor:
        """One flat float32 CPU vector of ``ndarrays`` (checked with :meth:`mismatch`)."""
        if not ndarrays:
            return torch.zeros(0, dtype=torch.float32)
        flat = np.concatenate([np.asarray(a, dtype=np.float32).reshape(-1) for a in ndarrays])
        return torch.from_numpy(flat)

    def unflatten(self, flat: torch.Tensor) -> list[np.ndarray]:
        """The model's arrays from a flat vector, each in its own shape and dtype (integer
        arrays such as batch counters are rounded: gossip averages them too)."""
        values = flat.detach().to(device="cpu", dtype=torch.float32).numpy()
        out, offset = [], 0
        for spec in self.arrays:
            chunk = values[offset : offset + spec.numel].reshape(spec.shape)
            offset += spec.numel
            if spec.dtype.kind in "iub":
                chunk = np.rint(chunk)
            out.append(chunk.astype(spec.dtype, copy=True))
        return out

    def array_record(self, flat: torch.Tensor) -> ArrayRecord:
        """An ``ArrayRecord`` keyed as the model's (a ``state_dict``'s names, say)."""
        record = ArrayRecord()
        for spec, array in zip(self.arrays, self.unflatten(flat), strict=True):
            record[spec.name] = Array(array)
        return record


def record_arrays(record: ArrayRecord) -> tuple[list[str], list[np.ndarray]]:
    """Names and ndarrays of an ``ArrayRecord``, in its order."""
    return list(record.keys()), [array.numpy() for array in record.values()]
