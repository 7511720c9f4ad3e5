"""Check a case's uploaded files and build the cells to send to the coordinator.

The web gateway and the batch command both come through here, so a file that the
page refuses is refused by a batch too, with the same message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pathmaster.analysis.budget import check_analysis_size
from pathmaster.image.io import ImageHeader, check_cell, decode_image, decode_mask, probe_image
from pathmaster.records import InvalidInput
from pathmaster.analysis.uploads import check_cell_image
from services.config import MAX_CASE_CELLS
from services.gateway.pairing import CellFiles, Pairing, extension_problem, mask_labels, pair_files, split_name
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb

MAX_FILE_BYTES = 8 * 1024 * 1024     # one uploaded file (page, batch); room for uncompressed TIFFs
MAX_CASE_FILES = 3 * MAX_CASE_CELLS + 64  # files in one upload: image, background, mask per cell,
                                         # and some that will be refused by name


@dataclass
class CheckedCase:
    """`cells` ready to send; `rejected`: (cell_id or file name, problem) for what was left out;
    `pairing`: how the files were grouped."""

    cells: list = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    pairing: Pairing = field(default_factory=Pairing)


def cell_problem(files: dict[str, bytes], cell: CellFiles,
                 max_bytes: int = MAX_FILE_BYTES) -> str | None:
    """What is wrong with one cell's files, or None when they are fine.

    Decodes the image, background and mask with the project's decoders, so the message
    names the file and the problem (empty, too large, not an image, corrupt, an image
    that is a mask or a field of view rather than one cell, a mask of the wrong size or with labels outside 0-3, a background of another size).
    """
    try:
        image = decode_image(files[cell.image], cell.image, max_bytes=max_bytes)
        check_cell_image(image, cell.image)
        background = mask = None
        if cell.background:
            background = decode_image(files[cell.background], cell.background,
                                      max_bytes=max_bytes)
            check_cell(image, None, background, cell.background)
        if cell.mask:
            mask = decode_mask(files[cell.mask], cell.mask, image.shape, max_bytes=max_bytes)
            check_cell(image, mask, None, cell.mask)
    except InvalidInput as exc:
        return str(exc)
    return None


def file_role(name: str) -> str:
    """What file `name` is in its cell, by its name: "image", "background" or "mask"."""
    return split_name(name)[1] or "image"


def check_file(name: str, data: bytes, max_bytes: int = MAX_FILE_BYTES) -> tuple[str, ImageHeader]:
    """Check one file on its own, as soon as it is chosen: (its role, its header).

    Decodes it with the project's decoders as what its name says it is (`file_role`): a
    cell image or a background must decode, a mask must be a label image with values
    0-3, and a cell image must be one cell, not a mask or a field of view
    (`check_cell_image`); none may be over `max_bytes`, or over the pixels one cell may have
    (`check_analysis_size`, as the sites refuse it). Raises InvalidInput naming the file
    and the problem. What needs the cell's other files (a background or mask of another
    size than its image) is `check_upload`'s, when the case is sent.
    """
    problem = extension_problem(name)
    if problem:
        raise InvalidInput(problem, name)
    role = file_role(name)
    header = probe_image(data, name, max_bytes=max_bytes)
    check_analysis_size(data, name)
    if role == "mask":
        decode_mask(data, name, header.shape, max_bytes=max_bytes)
    elif role == "image":
        check_cell_image(decode_image(data, name, max_bytes=max_bytes), name)
    else:
        decode_image(data, name, max_bytes=max_bytes)
    return role, header


def cell_header_problem(files: dict[str, bytes], cell: CellFiles,
                        max_bytes: int = MAX_FILE_BYTES,
                        headers: dict[str, ImageHeader] | None = None) -> str | None:
    """What one cell's file headers show to be wrong, or None; pixels are not decoded.

    The gateway's check before it sends (a few microseconds a file instead of ~5 ms of
    decoding): empty, too large, not an image, visibly cut short, or a background or mask
    whose size in pixels is not the image's. The coordinator and the sites decode every
    file and refuse, per cell, what only decoding finds (corrupt pixel data, mask labels
    outside 0-3); `cell_problem` is the full check. headers: the headers of files
    already checked (`check_file`, when staged), which are not probed again.
    """
    headers = headers or {}

    def header_of(name: str) -> ImageHeader:
        known = headers.get(name)
        return known if known is not None else probe_image(files[name], name, max_bytes=max_bytes)

    try:
        image = header_of(cell.image)
        for companion, what in ((cell.background, "background"), (cell.mask, "mask")):
            if not companion:
                continue
            header = header_of(companion)
            if header.shape != image.shape:
                raise InvalidInput(f"{what} is {header.width} x {header.height} pixels but its "
                                   f"image {cell.image} is {image.width} x {image.height}",
                                   companion)
    except InvalidInput as exc:
        return str(exc)
    return None


def check_upload(files: dict[str, bytes], max_bytes: int = MAX_FILE_BYTES,
                 max_cells: int = MAX_CASE_CELLS,
                 headers: dict[str, ImageHeader] | None = None) -> CheckedCase:
    """Pair uploaded files into cells and check each file.

    In:  {file name: bytes}. Out: a `CheckedCase`. A cell with any bad file (its image,
    background or mask, as its header shows: `cell_header_problem`) is rejected as a
    whole, naming the file and the problem; the other cells go ahead. Files that do not
    pair (see `pair_files`) are rejected too. headers: {file name: header} of files
    checked when they were staged (`check_file`): not probed again.
    """
    pairing = pair_files(files)
    checked = CheckedCase(pairing=pairing)
    checked.rejected.extend(pairing.problems)
    for n, cell in enumerate(pairing.cells):
        if n >= max_cells:
            checked.rejected.append((cell.cell_id, f"more than {max_cells} cells in one case; "
                                                   "send large sets with `pathmaster batch`"))
            continue
        problem = cell_header_problem(files, cell, max_bytes, headers)
        if problem:
            checked.rejected.append((cell.cell_id, problem))
            continue
        try:
            mask = mask_labels(cell.mask, files[cell.mask]) if cell.mask else b""
        except InvalidInput as exc:
            checked.rejected.append((cell.cell_id, str(exc)))
            continue
        checked.cells.append(pb.CellImage(
            cell_id=cell.cell_id, image=files[cell.image],
            background=files[cell.background] if cell.background else b"", mask=mask))
    return checked
