"""Read a PyTorch state dict saved in the legacy (pre-1.6, non-zip) ``torch.save`` format.

Hand-written because no well-kept library reads this format without torch: ``torch.load``
itself needs torch (and its ~2.8 GB of CUDA libraries from the registry); safetensors
converts such files only by calling ``torch.load`` first (its ``convert.py``); NumPy's
``np.load`` reads ``.npy``/``.npz``, not torch's pickles; ``torchfile`` reads the older
Lua Torch7 format, not this one. The format is small (what ``torch.serialization``'s
``_legacy_save`` writes), five parts one after another:

1. a pickled magic number, 2. a pickled protocol version (1001), 3. a pickled dict of the
   writer's type sizes (little endian checked);
4. the pickled state dict, an ``OrderedDict`` of name -> ``torch._utils._rebuild_tensor_v2(
   storage, offset, size, stride, ...)``, each storage a persistent id ``("storage",
   torch.FloatStorage, key, location, numel, view_metadata)``;
5. a pickled list of the storage keys, then each storage's bytes in that order: its element
   count (int64, little endian) and its elements.

A pickle runs whatever callables it names, and this one is a file we did not write, so the
unpickler (`_RestrictedUnpickler`) resolves only the few names such a file needs and refuses
every other global with ``pickle.UnpicklingError`` (the standard library's "restricting
globals" recipe). Nothing in the file is executed: a tensor is rebuilt here, in NumPy.
"""

from __future__ import annotations

import collections
import pickle
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

# torch.serialization's MAGIC_NUMBER and PROTOCOL_VERSION of the legacy format.
MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001
# The storage classes a state dict may name, and their elements (little endian).
STORAGE_DTYPES = {
    "FloatStorage": np.dtype("<f4"),
    "DoubleStorage": np.dtype("<f8"),
    "HalfStorage": np.dtype("<f2"),
    "LongStorage": np.dtype("<i8"),
    "IntStorage": np.dtype("<i4"),
}


@dataclass(frozen=True)
class _StorageType:
    """What ``torch.FloatStorage`` and the like resolve to: the storage's element type."""

    dtype: np.dtype


@dataclass
class _Storage:
    """A storage named in the state dict; its elements are read after the pickle."""

    key: str
    dtype: np.dtype
    numel: int
    data: np.ndarray | None = None


@dataclass(frozen=True)
class _TensorRef:
    """What ``_rebuild_tensor_v2`` returns here: where a tensor's elements lie in a storage."""

    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None,
                       metadata=None):
    """Stand-in for ``torch._utils._rebuild_tensor_v2`` (same arguments): a `_TensorRef`."""
    if not isinstance(storage, _Storage):
        raise pickle.UnpicklingError("a tensor whose storage is not a persistent storage id")
    return _TensorRef(storage, int(storage_offset), tuple(int(n) for n in size), tuple(int(n) for n in stride))


class _RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only a legacy state dict's names and keeps its storages."""

    def __init__(self, file: BinaryIO):
        super().__init__(file)
        self.storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor_v2
        if module == "torch" and name in STORAGE_DTYPES:
            return _StorageType(STORAGE_DTYPES[name])
        raise pickle.UnpicklingError(f"refused global {module}.{name}: not part of a tensor state dict")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 6 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType)):
            raise pickle.UnpicklingError("a persistent id that is not a storage")
        _, storage_type, key, _location, numel, view_metadata = pid
        if view_metadata is not None:
            raise pickle.UnpicklingError("storage views are not supported")
        storage = self.storages.get(str(key))
        if storage is None:
            storage = self.storages[str(key)] = _Storage(str(key), storage_type.dtype, int(numel))
        return storage


def _load_plain(file: BinaryIO):
    """One pickle of plain data (numbers, strings, lists, dicts): any global is refused."""
    return _RestrictedUnpickler(file).load()


def _read_storages(file: BinaryIO, storages: dict[str, _Storage]) -> None:
    """Part 5: the list of keys, then each storage's element count and elements."""
    keys = _load_plain(file)
    if not isinstance(keys, list) or set(keys) != set(storages):
        raise ValueError("the storage keys do not match the tensors' storages")
    for key in keys:
        storage = storages[key]
        (numel,) = struct.unpack("<q", file.read(8))
        raw = file.read(numel * storage.dtype.itemsize)
        if numel != storage.numel or len(raw) != numel * storage.dtype.itemsize:
            raise ValueError(f"storage {key}: {numel} elements where {storage.numel} were declared, or truncated")
        storage.data = np.frombuffer(raw, storage.dtype)


def _materialise(ref: _TensorRef) -> np.ndarray:
    """The tensor's elements as a C-contiguous array of their native dtype."""
    data = ref.storage.data
    last = ref.offset + sum((n - 1) * s for n, s in zip(ref.size, ref.stride) if n > 0)
    if ref.offset < 0 or min(ref.stride, default=0) < 0 or (0 not in ref.size and last >= data.size):
        raise ValueError(f"a tensor reaches outside its storage {ref.storage.key}")
    if 0 in ref.size:
        return np.zeros(ref.size, data.dtype)
    strides = tuple(s * data.itemsize for s in ref.stride)
    view = np.lib.stride_tricks.as_strided(data[ref.offset:], shape=ref.size, strides=strides, writeable=False)
    return np.ascontiguousarray(view).astype(data.dtype.newbyteorder("="), copy=False)


def read_state_dict(source: str | Path | BinaryIO) -> dict[str, np.ndarray]:
    """The tensors of a legacy-format ``.pth`` state dict, by name, as NumPy arrays.

    Parameters
    ----------
    source : str, Path or binary file
        A file (or its bytes, e.g. ``io.BytesIO``) written by ``torch.save(model.state_dict(), path, _use_new_zipfile_serialization=False)``
        (or by torch before 1.6).

    Returns
    -------
    dict of str -> ndarray
        Each tensor in the file's order, C-contiguous, its own dtype (float32 for
        ``FloatStorage``, int64 for ``LongStorage``...), shaped as in torch (NCHW kernels).

    Raises
    ------
    pickle.UnpicklingError
        The file names a global other than the state dict's (e.g. ``os.system``).
    ValueError
        Not a legacy ``.pth`` file, or its storages do not match its tensors.
    """
    if isinstance(source, (str, Path)):
        with open(source, "rb") as file:
            return read_state_dict(file)
    file = source
    if _load_plain(file) != MAGIC_NUMBER or _load_plain(file) != PROTOCOL_VERSION:
        raise ValueError("not a legacy PyTorch file (magic number or protocol)")
    sys_info = _load_plain(file)
    if not (isinstance(sys_info, dict) and sys_info.get("little_endian")):
        raise ValueError("written on a big-endian machine, not supported")
    unpickler = _RestrictedUnpickler(file)
    state = unpickler.load()
    if not isinstance(state, dict) or not all(isinstance(v, _TensorRef) for v in state.values()):
        raise ValueError("not a state dict of tensors")
    _read_storages(file, unpickler.storages)
    return {str(name): _materialise(ref) for name, ref in state.items()}
