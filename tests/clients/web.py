"""What the tests send to the gateway the way a browser does."""

from __future__ import annotations

import uuid


def multipart(fields: dict[str, str], files: dict[str, bytes]) -> tuple[bytes, str]:
    """(body, content type) of a multipart/form-data upload, as a browser's FormData sends it."""
    boundary = uuid.uuid4().hex
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
             for k, v in fields.items()]
    for name, data in files.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="files"; '
                     f'filename="{name}"\r\nContent-Type: application/octet-stream\r\n\r\n'.encode()
                     + data + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"
