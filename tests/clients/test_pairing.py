"""The file-pairing rule shared by the page and the batch: NAME, NAME-background, NAME-mask."""

from services.gateway.pairing import pair_files, split_name


def test_companions_pair_with_their_cell_by_name():
    pairing = pair_files(["c2.png", "c1-mask.png", "c1.png", "c1-Background.PNG", "c2-mask.bmp"])
    assert [c.as_dict() for c in pairing.cells] == [
        {"cell_id": "c1", "image": "c1.png", "background": "c1-Background.PNG", "mask": "c1-mask.png"},
        {"cell_id": "c2", "image": "c2.png", "background": None, "mask": "c2-mask.bmp"},
    ]
    assert pairing.problems == []


def test_files_that_cannot_pair_are_named_with_the_reason():
    pairing = pair_files(["a.png", "a.bmp", "b-mask.png", "notes.txt", "ok.tif"])
    assert [c.cell_id for c in pairing.cells] == ["a", "ok"]
    problems = dict(pairing.problems)
    assert set(problems) == {"a.png", "b-mask.png", "notes.txt"}
    assert "second cell image" in problems["a.png"] and "a.bmp" in problems["a.png"]
    assert "mask without its cell image" in problems["b-mask.png"]
    assert "not an image file" in problems["notes.txt"]


def test_cells_in_different_folders_keep_different_ids():
    pairing = pair_files(["mild/7.bmp", "severe/7.bmp", "severe/7-mask.png"])
    assert [(c.cell_id, c.mask) for c in pairing.cells] == [("mild/7", None),
                                                             ("severe/7", "severe/7-mask.png")]
    assert split_name("x/y-background.png") == ("x/y", "background")


def test_herlev_colour_masks_pair_and_are_sent_as_labels():
    import io

    import numpy as np
    from PIL import Image

    from pathmaster.image.io import decode_mask
    from services.gateway.pairing import mask_labels, pair_files

    pairing = pair_files(["157181599-157181627-001.BMP", "157181599-157181627-001-d.bmp"])
    assert pairing.problems == []
    assert [(c.image, c.mask) for c in pairing.cells] == [
        ("157181599-157181627-001.BMP", "157181599-157181627-001-d.bmp")]
    rgb = np.zeros((4, 6, 3), dtype=np.uint8)
    rgb[...] = (255, 0, 0)      # background
    rgb[1:3, 1:5] = (0, 0, 128)  # cytoplasm
    rgb[2, 2] = (0, 0, 255)      # nucleus
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, "BMP")
    labels = decode_mask(mask_labels("x-d.bmp", out.getvalue()), "x-d.bmp", (4, 6))
    assert labels[0, 0] == 0 and labels[1, 1] == 1 and labels[2, 2] == 2
    assert mask_labels("x-mask.png", b"as it is") == b"as it is"  # other masks go as they are
