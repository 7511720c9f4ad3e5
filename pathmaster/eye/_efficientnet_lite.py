"""EfficientNet-Lite0's forward pass in NumPy float32, channels last, from its torch state dict.

The network of ``efficientnet-lite-pytorch`` 0.1.0 (``EfficientNet.from_pretrained(
'efficientnet-lite0')``, itself the TensorFlow Lite0 of Tan & Le 2019 converted), op for op:

- the input: RGB in [0, 255] as ``(x - 127) / 128`` (MEAN_RGB and STDDEV_RGB of TensorFlow's
  ``efficientnet_lite_builder.py``, "inception-style" for the edge models; ImageNet's
  mean/std gives the same top class on the reference pictures, less confidently: daisy
  0.11 against 0.32);
- the stem: 3x3 convolution, stride 2, 32 channels; then 16 MBConv blocks in 7 stages
  (`STAGES`): a 1x1 expansion (x6, none in the first stage), a kxk depthwise convolution,
  a 1x1 projection, and the input added back where a block keeps its shape; then the head,
  a 1x1 convolution to 1280 channels, the global average and the 1000-class classifier;
- every convolution followed by batch normalisation (eps 1e-3) and ReLU6, except the
  projection (linear); no squeeze-and-excitation (the Lite models drop it);
- TensorFlow's "same" padding: output ceil(size / stride), the zeros split with the extra
  one after (bottom/right), so a stride-2 convolution of an even size pads unevenly (3x3:
  0 before, 1 after; 5x5: 1 and 2), of an odd size evenly.

Batch normalisation is folded into the convolutions once, at load (`fold_weights`): a
kernel scaled by gamma / sqrt(var + eps) per output channel, and a bias. A 1x1 convolution
is a matrix product of (pixels, Cin) by (Cin, Cout); the depthwise convolution is the sum
of k*k shifted channels-last slices times their weights (`depthwise`).

Blocks are numbered 0..15 as the weights name them (``_blocks.N``); `HEAD` (16) is the head
convolution's output, counted as one more block; `STAGE_ENDS` are the last block of each
stage. `pooled_blocks` stops after the last block asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# EfficientNet-Lite0's stages (efficientnet_lite in efficientnet-lite-pytorch's utils.py):
# (repeats, kernel, stride of the first block, expansion ratio, input channels, output channels).
STAGES = (
    (1, 3, 1, 1, 32, 16),
    (2, 3, 2, 6, 16, 24),
    (2, 5, 2, 6, 24, 40),
    (3, 3, 2, 6, 40, 80),
    (3, 5, 1, 6, 80, 112),
    (4, 5, 2, 6, 112, 192),
    (1, 3, 1, 6, 192, 320),
)
BN_EPS = 1e-3
STEM_CHANNELS = 32
HEAD_CHANNELS = 1280
N_CLASSES = 1000
# The input scaling the weights were trained with: (x - INPUT_MEAN) / INPUT_STD, x in [0, 255].
INPUT_MEAN = 127.0
INPUT_STD = 128.0


@dataclass(frozen=True)
class Block:
    """One MBConv block's shape: kernel, stride, channels in/expanded/out, residual or not."""

    kernel: int
    stride: int
    channels_in: int
    channels_mid: int
    channels_out: int

    @property
    def residual(self) -> bool:
        return self.stride == 1 and self.channels_in == self.channels_out


def _blocks() -> tuple[Block, ...]:
    """The 16 blocks in order: each stage's first block strides and widens, the rest keep."""
    blocks = []
    for repeats, kernel, stride, expand, channels_in, channels_out in STAGES:
        for i in range(repeats):
            cin = channels_in if i == 0 else channels_out
            blocks.append(Block(kernel, stride if i == 0 else 1, cin, cin * expand, channels_out))
    return tuple(blocks)


BLOCKS = _blocks()
HEAD = len(BLOCKS)  # the head convolution's output, as one more block
STAGE_ENDS = tuple(int(i) for i in np.cumsum([stage[0] for stage in STAGES]) - 1)  # (0, 2, 4, 7, 10, 14, 15)
# Channels (the pooled vector's length) of each block's output, the head's last.
BLOCK_CHANNELS = tuple(b.channels_out for b in BLOCKS) + (HEAD_CHANNELS,)


def _fold(state: dict, conv: str, bn: str) -> tuple[np.ndarray, np.ndarray]:
    """Kernel (Cout, Cin/groups, kh, kw) and bias (Cout,) of ``conv`` followed by ``bn``."""
    scale = state[f"{bn}.weight"] / np.sqrt(state[f"{bn}.running_var"] + np.float32(BN_EPS))
    kernel = state[f"{conv}.weight"] * scale[:, None, None, None]
    bias = state[f"{bn}.bias"] - state[f"{bn}.running_mean"] * scale
    return kernel.astype(np.float32), bias.astype(np.float32)


def _matrix(kernel: np.ndarray) -> np.ndarray:
    """A 1x1 kernel (Cout, Cin, 1, 1) as the (Cin, Cout) matrix that multiplies pixels."""
    return np.ascontiguousarray(kernel[:, :, 0, 0].T)


def fold_weights(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The network's weights, batch normalisation folded in, laid out for channels last.

    Parameters
    ----------
    state : dict of str -> ndarray
        The torch state dict (`pathmaster.eye._pth.read_state_dict`), kernels NCHW.

    Returns
    -------
    dict of str -> ndarray of float32
        ``stem.w`` (27, 32): the 3x3x3 kernel as a matrix over (row, column, channel)
        windows; ``blocks.N.expand.w`` (Cin, Cmid) where the block expands,
        ``blocks.N.depthwise.w`` (k, k, Cmid), ``blocks.N.project.w`` (Cmid, Cout);
        ``head.w`` (320, 1280); ``fc.w`` (1280, 1000); each with its ``.b`` bias.
    """
    weights = {}
    kernel, weights["stem.b"] = _fold(state, "_conv_stem", "_bn0")
    weights["stem.w"] = np.ascontiguousarray(kernel.transpose(2, 3, 1, 0).reshape(-1, STEM_CHANNELS))
    for n, block in enumerate(BLOCKS):
        name = f"_blocks.{n}"
        if block.channels_mid != block.channels_in:
            kernel, weights[f"blocks.{n}.expand.b"] = _fold(state, f"{name}._expand_conv", f"{name}._bn0")
            weights[f"blocks.{n}.expand.w"] = _matrix(kernel)
        kernel, weights[f"blocks.{n}.depthwise.b"] = _fold(state, f"{name}._depthwise_conv", f"{name}._bn1")
        weights[f"blocks.{n}.depthwise.w"] = np.ascontiguousarray(kernel[:, 0].transpose(1, 2, 0))
        kernel, weights[f"blocks.{n}.project.b"] = _fold(state, f"{name}._project_conv", f"{name}._bn2")
        weights[f"blocks.{n}.project.w"] = _matrix(kernel)
    kernel, weights["head.b"] = _fold(state, "_conv_head", "_bn1")
    weights["head.w"] = _matrix(kernel)
    weights["fc.w"] = np.ascontiguousarray(state["_fc.weight"].T, dtype=np.float32)
    weights["fc.b"] = state["_fc.bias"].astype(np.float32)
    return weights


def same_padding(size: int, kernel: int, stride: int) -> tuple[int, int]:
    """(output size, zeros before) of TensorFlow's "same" padding along one axis."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return out, total // 2


def _tap(offset: int, before: int, size: int, out: int, stride: int) -> tuple[slice, slice]:
    """(input slice, output slice) along one axis for the kernel tap at ``offset``: the
    outputs o whose input o * stride + offset - before lies inside [0, size)."""
    first = max(0, -((offset - before) // stride))
    last = min(out, (size - 1 + before - offset) // stride + 1)
    start = first * stride + offset - before
    return slice(start, start + (last - first - 1) * stride + 1, stride), slice(first, last)


def depthwise(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray, stride: int) -> np.ndarray:
    """Depthwise kxk convolution with "same" padding, plus bias, then ReLU6.

    Parameters
    ----------
    x : ndarray of float32, shape (n, H, W, C)
    kernel : ndarray of float32, shape (k, k, C)
    bias : ndarray of float32, shape (C,)
    stride : int

    Returns
    -------
    ndarray of float32, shape (n, ceil(H / stride), ceil(W / stride), C)

    Notes
    -----
    The sum over the k*k taps of each tap's shifted slice times its weights, two ways, the
    faster for each kernel (measured on one core at 224 px, the 16 blocks' shapes): 3x3 as
    9 whole-slice multiply-adds (`_depthwise_shifted`, 7.2 ms against 9.9 for the windows),
    5x5 as one ``einsum`` over the windows of a zero-padded copy (`_depthwise_windows`, 5.6
    ms against 8.0: 25 taps are 50 NumPy calls, each a pass over memory).
    """
    out = _depthwise_shifted(x, kernel, bias, stride) if kernel.shape[0] <= 3 else \
        _depthwise_windows(x, kernel, bias, stride)
    return np.clip(out, 0.0, 6.0, out=out)


def _depthwise_shifted(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray, stride: int) -> np.ndarray:
    """`depthwise` before its ReLU6, as k*k multiply-adds of whole slices, each tap clipped
    to the outputs it reaches (which is the zero padding, without padding)."""
    n, h, w, c = x.shape
    k = kernel.shape[0]
    (oh, top), (ow, left) = same_padding(h, k, stride), same_padding(w, k, stride)
    out = np.empty((n, oh, ow, c), np.float32)
    out[...] = bias
    product = np.empty_like(out)
    for dy in range(k):
        rows_in, rows_out = _tap(dy, top, h, oh, stride)
        for dx in range(k):
            cols_in, cols_out = _tap(dx, left, w, ow, stride)
            term = product[:, rows_out, cols_out]
            np.multiply(x[:, rows_in, cols_in], kernel[dy, dx], out=term)
            target = out[:, rows_out, cols_out]
            np.add(target, term, out=target)
    return out


def _depthwise_windows(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray, stride: int) -> np.ndarray:
    """`depthwise` before its ReLU6, as one sum of products over the k x k windows of a
    zero-padded copy (TensorFlow's zeros before and after), every ``stride``-th window."""
    n, h, w, c = x.shape
    k = kernel.shape[0]
    (oh, top), (ow, left) = same_padding(h, k, stride), same_padding(w, k, stride)
    padded = np.zeros((n, (oh - 1) * stride + k, (ow - 1) * stride + k, c), np.float32)
    padded[:, top:top + h, left:left + w] = x
    windows = np.lib.stride_tricks.sliding_window_view(padded, (k, k), axis=(1, 2))[:, ::stride, ::stride]
    out = np.einsum("nhwcij,ijc->nhwc", windows, kernel)
    out += bias
    return out


def pointwise(x: np.ndarray, matrix: np.ndarray, bias: np.ndarray, relu6: bool) -> np.ndarray:
    """1x1 convolution of (n, H, W, Cin) by a (Cin, Cout) matrix, plus bias, ReLU6 or linear."""
    n, h, w, c = x.shape
    out = np.matmul(x.reshape(n * h * w, c), matrix)
    out += bias
    if relu6:
        np.clip(out, 0.0, 6.0, out=out)
    return out.reshape(n, h, w, matrix.shape[1])


def stem(weights: dict, x: np.ndarray) -> np.ndarray:
    """The stem: 3x3 convolution, stride 2, "same" padding, of (n, H, W, 3), then ReLU6."""
    n, h, w, c = x.shape
    (oh, top), (ow, left) = same_padding(h, 3, 2), same_padding(w, 3, 2)
    padded = np.zeros((n, 2 * oh + 2, 2 * ow + 2, c), np.float32)
    padded[:, top:top + h, left:left + w] = x
    windows = np.empty((n, oh, ow, 3, 3, c), np.float32)
    for dy in range(3):
        for dx in range(3):
            windows[:, :, :, dy, dx] = padded[:, dy:dy + 2 * oh:2, dx:dx + 2 * ow:2]
    return pointwise(windows.reshape(n, oh, ow, 9 * c), weights["stem.w"], weights["stem.b"], relu6=True)


def mbconv(weights: dict, n: int, x: np.ndarray) -> np.ndarray:
    """Block ``n`` (0..15) on its input (n_images, H, W, Cin): expand, depthwise, project, add."""
    block = BLOCKS[n]
    y = x
    if block.channels_mid != block.channels_in:
        y = pointwise(x, weights[f"blocks.{n}.expand.w"], weights[f"blocks.{n}.expand.b"], relu6=True)
    y = depthwise(y, weights[f"blocks.{n}.depthwise.w"], weights[f"blocks.{n}.depthwise.b"], block.stride)
    y = pointwise(y, weights[f"blocks.{n}.project.w"], weights[f"blocks.{n}.project.b"], relu6=False)
    if block.residual:
        y += x
    return y


def normalise_input(images: np.ndarray) -> np.ndarray:
    """uint8 RGB (n, H, W, 3) as the network's float32 input, (x - 127) / 128."""
    return (np.asarray(images, np.float32) - np.float32(INPUT_MEAN)) / np.float32(INPUT_STD)


def pooled_blocks(weights: dict, x: np.ndarray, blocks: tuple[int, ...]) -> list[np.ndarray]:
    """Global-average pooled outputs of ``blocks`` for the network's input ``x``.

    Parameters
    ----------
    weights : dict
        `fold_weights`'s arrays.
    x : ndarray of float32, shape (n, H, W, 3)
        `normalise_input`'s output.
    blocks : tuple of int
        Block numbers in 0..`HEAD`; the pass stops after the largest.

    Returns
    -------
    list of ndarray of float32, shape (n, BLOCK_CHANNELS[b])
        One per block asked for, in the order asked.
    """
    if not blocks or min(blocks) < 0 or max(blocks) > HEAD:
        raise ValueError(f"blocks must be numbers in 0..{HEAD}, got {blocks}")
    pooled = {}
    x = stem(weights, x)
    for n in range(max(blocks) + 1):
        if n < HEAD:
            x = mbconv(weights, n, x)
        else:
            x = pointwise(x, weights["head.w"], weights["head.b"], relu6=True)
        if n in blocks:
            pooled[n] = x.mean(axis=(1, 2), dtype=np.float32)
    return [pooled[n] for n in blocks]


def logits(weights: dict, x: np.ndarray) -> np.ndarray:
    """ImageNet logits (n, 1000) float32 of the network's input ``x`` (n, H, W, 3)."""
    (head,) = pooled_blocks(weights, x, (HEAD,))
    return head @ weights["fc.w"] + weights["fc.b"]
