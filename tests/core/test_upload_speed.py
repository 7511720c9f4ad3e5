"""The faster paths of an upload's analysis give the reference's numbers, on synthetic and
on real cells: the network's NumPy inference against `embedding.forward`, the patch it
sees against its definition, the cytoplasm's extrema against scikit-image's, the shape
moments against regionprops'."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from pathmaster import embedding as emb


def weights(seed: int, n_classes: int = 3) -> dict:
    """`learn.init_params`' weights with random biases of either sign (it starts them at 0;
    the pooling runs before the bias and ReLU in the fast path, which must not matter)."""
    from pathmaster.learn import init_params  # NumPy only: JAX is imported by training

    params = init_params(seed, n_classes)
    rng = np.random.default_rng(seed)
    for name in [name for name in params if name.endswith("_b")]:
        params[name] = rng.normal(0, 0.3, params[name].shape).astype(np.float32)
    return params


def reference_embed(model: emb.Embedder, patches: np.ndarray) -> np.ndarray:
    """The embedding as its definition gives it: `forward` over `dihedral`'s 8 views of
    every patch at once, averaged per patch."""
    views = emb.dihedral(patches.astype(np.float32) / 200.0)
    embedding, _ = emb.forward(model.params, views.reshape(-1, *patches.shape[1:]))
    return embedding.reshape(8, len(patches), -1).mean(axis=0).astype(np.float32)


def assert_same_numbers(got: np.ndarray, expected: np.ndarray) -> None:
    """``got`` equals ``expected`` to float32 rounding, as `embedding._embed_views` promises
    (its reordered rows may be summed differently by the BLAS kernel). A wrong window, view
    or pooling is off by far more than this."""
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * float(np.abs(expected).max()))


def patches_of(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, emb.PATCH_PX, emb.PATCH_PX, 3)).astype(np.uint8)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_embed_equals_the_forward_pass(seed):
    model = emb.Embedder(weights(seed), ["a", "b", "c"], np.array([False, True, True]))
    patches = patches_of(seed, 5)
    expected = reference_embed(model, patches)
    got = model.embed(patches)
    assert got.dtype == np.float32 and got.shape == (5, emb.EMBEDDING_DIM)
    assert_same_numbers(got, expected)
    # One patch, as an upload sends it, gives bit for bit what it gives in a batch of cells
    # (indexing): a query that is in the database is found at distance 0.
    assert np.array_equal(model.embed(patches[2]), got[2:3])
    np.testing.assert_allclose(model.abnormal_probability(got), model.abnormal_probability(expected),
                               rtol=1e-5, atol=1e-6)
    assert (expected > 0).any() and (expected == 0).any()  # the ReLUs cut something, and not everything


def test_embed_keeps_no_state_between_models_nor_threads_and_bounded_buffers():
    first = emb.Embedder(weights(3), ["a", "b"], np.array([False, True]))
    second = emb.Embedder(weights(4), ["a", "b"], np.array([False, True]))
    patches = patches_of(6, 3)
    expected = [first.embed(patches), second.embed(patches)]
    assert_same_numbers(expected[0], reference_embed(first, patches))
    assert_same_numbers(expected[1], reference_embed(second, patches))
    assert not np.allclose(expected[0], expected[1])  # two models, two answers
    results: dict = {}

    def run(name, model, truth):
        results[name] = all(np.array_equal(model.embed(patches), truth) for _ in range(20))

    threads = [threading.Thread(target=run, args=(name, model, truth))
               for name, model, truth in (("first", first, expected[0]), ("second", second, expected[1]))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert results == {"first": True, "second": True}
    assert len(emb._free_workspaces) <= emb.KEPT_WORKSPACES  # buffers kept do not grow with threads


def real_uploads(folder: Path, every: int = 20) -> list[np.ndarray]:
    from PIL import Image

    return [np.asarray(Image.open(path).convert("RGB")) for path in sorted(folder.glob("*/*.jpg"))[::every]]


def test_embed_equals_the_forward_pass_on_real_cells(herlev_224_dev):
    from pathmaster.site import analyse_cell

    patches = np.stack([analyse_cell(image).patch for image in real_uploads(herlev_224_dev)])
    assert len(patches) >= 20
    model = emb.Embedder(weights(7), ["a", "b", "c"], np.array([False, True, True]))
    assert_same_numbers(model.embed(patches), reference_embed(model, patches))


def reference_patch(image: np.ndarray, background: np.ndarray, size: int = emb.PATCH_PX) -> np.ndarray:
    """`embedding.cell_patch` as its docstring defines it, computed per pixel in float32."""
    import cv2

    h, w = image.shape[:2]
    white = np.maximum(np.median(background.reshape(-1, 3), axis=0).astype(np.float32), 1.0)
    side = max(h, w)
    canvas = np.ones((side, side, 3), np.float32)
    top, left = (side - h) // 2, (side - w) // 2
    canvas[top:top + h, left:left + w] = image.astype(np.float32) / white
    scaled = np.clip(canvas * 200.0, 0, 255).astype(np.uint8)
    return cv2.resize(scaled, (size, size), interpolation=cv2.INTER_AREA if side >= size else cv2.INTER_LINEAR)


def check_cell(image: np.ndarray, background: np.ndarray, mask: np.ndarray) -> None:
    """The patch, the extrema and the shape moments of one cell equal their references."""
    from skimage import measure, morphology

    from pathmaster.features.geometry import ellipse, largest_piece
    from pathmaster.features.regions import crop_regions
    from pathmaster.morphology import regional_maxima

    assert np.array_equal(emb.cell_patch(image, background), reference_patch(image, background))
    crop = crop_regions(image, background, mask)
    grey = crop.image.sum(axis=2, dtype=np.int32)
    assert np.array_equal(regional_maxima(grey), morphology.local_maxima(grey, connectivity=2, allow_borders=True))
    assert np.array_equal(regional_maxima(765 - grey), morphology.local_minima(grey, connectivity=2,
                                                                                allow_borders=True))
    for region in (crop.nucleus, crop.cell):
        piece = largest_piece(region)
        props, ours = measure.regionprops(piece.astype(np.uint8))[0], ellipse(piece)
        assert ours.area == props.area and ours.box == props.slice and ours.centroid == props.centroid
        # The eigenvalues to rounding: OpenCV's central moments come from the raw ones.
        np.testing.assert_allclose(ours.eigenvalues, props.inertia_tensor_eigvals, rtol=1e-9, atol=1e-9)
        assert ours.eccentricity == pytest.approx(props.eccentricity, rel=1e-9, abs=1e-6)
        assert ours.major_axis == pytest.approx(props.axis_major_length, rel=1e-9)
        assert ours.minor_axis == pytest.approx(props.axis_minor_length, rel=1e-9, abs=1e-6)


def test_patch_extrema_and_moments_equal_their_references_on_synthetic_cells():
    from pathmaster.records import DIAGNOSES
    from pathmaster.site import analyse_cell
    from pathmaster.synth import cell_rng, synth_cell

    for i, diagnosis in enumerate(DIAGNOSES):
        cell = synth_cell(diagnosis, cell_rng(31, i))
        check_cell(cell.image, cell.background, cell.mask)
        analysis = analyse_cell(cell.image)  # as an upload: mask and slide estimated
        check_cell(cell.image, analysis.background, analysis.mask)


def test_patch_extrema_and_moments_equal_their_references_on_real_uploads(herlev_224_dev):
    from pathmaster.site import analyse_cell

    for image in real_uploads(herlev_224_dev):
        analysis = analyse_cell(image)
        check_cell(image, analysis.background, analysis.mask)
