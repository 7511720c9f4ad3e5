"""The faster paths of an upload's analysis give the reference's numbers: the network's
NumPy inference against `embedding.forward`, on random and on real cells' patches."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from pathmaster import embedding as emb


def weights(seed: int, n_classes: int = 3) -> dict:
    """Random weights of `embedding.forward`, biases included (either sign: the pooling
    runs before the bias and ReLU in the fast path, which must not matter)."""
    rng = np.random.default_rng(seed)
    params, c_in = {}, 3
    for i, c_out in enumerate(emb.CHANNELS):
        params[f"conv{i}_w"] = rng.normal(0, np.sqrt(2 / (9 * c_in)), (3, 3, c_in, c_out)).astype(np.float32)
        params[f"conv{i}_b"] = rng.normal(0, 0.3, c_out).astype(np.float32)
        c_in = c_out
    params["embed_w"] = rng.normal(0, np.sqrt(2 / c_in), (c_in, emb.EMBEDDING_DIM)).astype(np.float32)
    params["embed_b"] = rng.normal(0, 0.1, emb.EMBEDDING_DIM).astype(np.float32)
    params["head_w"] = rng.normal(0, 0.1, (emb.EMBEDDING_DIM, n_classes)).astype(np.float32)
    params["head_b"] = rng.normal(0, 0.1, n_classes).astype(np.float32)
    return params


def reference_embed(model: emb.Embedder, patches: np.ndarray) -> np.ndarray:
    """The embedding as its definition gives it: `forward` over `dihedral`'s 8 views of
    every patch at once, averaged per patch."""
    views = emb.dihedral(patches.astype(np.float32) / 200.0)
    embedding, _ = emb.forward(model.params, views.reshape(-1, *patches.shape[1:]))
    return embedding.reshape(8, len(patches), -1).mean(axis=0).astype(np.float32)


def patches_of(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, emb.PATCH_PX, emb.PATCH_PX, 3)).astype(np.uint8)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_embed_equals_the_forward_pass_bit_for_bit(seed):
    model = emb.Embedder(weights(seed), ["a", "b", "c"], np.array([False, True, True]))
    patches = patches_of(seed, 5)
    expected = reference_embed(model, patches)
    got = model.embed(patches)
    assert got.dtype == np.float32 and got.shape == (5, emb.EMBEDDING_DIM)
    assert np.array_equal(got, expected)
    assert np.array_equal(model.embed(patches[2]), expected[2:3])  # one patch, as an upload sends it
    assert np.array_equal(model.abnormal_probability(got), model.abnormal_probability(expected))
    assert (expected > 0).any() and (expected == 0).any()  # the ReLUs cut something, and not everything


def test_embed_keeps_no_state_between_models_nor_threads():
    first = emb.Embedder(weights(3), ["a", "b"], np.array([False, True]))
    second = emb.Embedder(weights(4), ["a", "b"], np.array([False, True]))
    patches = patches_of(6, 3)
    expected = [reference_embed(first, patches), reference_embed(second, patches)]
    assert np.array_equal(first.embed(patches), expected[0])
    assert np.array_equal(second.embed(patches), expected[1])
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


def real_uploads(folder: Path, every: int = 20) -> list[np.ndarray]:
    from PIL import Image

    return [np.asarray(Image.open(path).convert("RGB")) for path in sorted(folder.glob("*/*.jpg"))[::every]]


def test_embed_equals_the_forward_pass_on_real_cells(herlev_224_dev):
    from pathmaster.site import analyse_cell

    patches = np.stack([analyse_cell(image).patch for image in real_uploads(herlev_224_dev)])
    assert len(patches) >= 20
    model = emb.Embedder(weights(7), ["a", "b", "c"], np.array([False, True, True]))
    assert np.array_equal(model.embed(patches), reference_embed(model, patches))
