"""TLS and mutual-TLS credentials from PEM files, used by every server and channel.

A server re-reads its certificate, key and CA files when they change (the next connection
uses them; connections and calls in progress are untouched), so certificates are rotated
without a restart: replace the files by rename.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc

log = logging.getLogger("pathmaster.transport")

def check_key_pair(cert, key) -> None:
    """ValueError unless the PEM files `cert` and `key` can be read and the key is the
    certificate's (a rotation half done is not)."""
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise ValueError(f"TLS key {key} does not match certificate {cert}: {exc}") from None
    except OSError as exc:
        raise ValueError(f"TLS cert/key {cert}, {key}: {exc.strerror}") from None


def files_signature(paths) -> tuple:
    """What changes when any of the files is replaced or rewritten (inode, size, mtime);
    () when one cannot be read."""
    try:
        return tuple((st.st_ino, st.st_size, st.st_mtime_ns) for st in map(os.stat, paths))
    except OSError:
        return ()


class _ServerFiles:
    """A server's certificate, key and CA files, re-read when they change: grpc calls
    `fetch` before each new connection's handshake (grpc.dynamic_ssl_server_credentials).

    A change is a new inode, size or modification time of any file. A certificate whose key
    does not match it (a rotation half done) is not taken: the server keeps the last good
    pair and takes the new one once both files are in place.
    """

    def __init__(self, tls: "TLSFiles"):
        self.tls = tls
        self._seen = self._signature()
        self.initial = self._configuration()
        self._lock = threading.Lock()

    def _paths(self) -> list[Path]:
        return [Path(p) for p in (self.tls.cert, self.tls.key, self.tls.ca if self.tls.mutual else None) if p]

    def _signature(self) -> tuple:
        return files_signature(self._paths())

    def _configuration(self):
        check_key_pair(self.tls.cert, self.tls.key)
        return grpc.ssl_server_certificate_configuration(
            [(self.tls._read("key"), self.tls._read("cert"))],
            root_certificates=self.tls._read("ca") if self.tls.mutual else None,
        )

    def fetch(self):
        """The new configuration when the files changed since last time, else None (keep)."""
        with self._lock:
            signature = self._signature()
            if not signature or signature == self._seen:
                return None
            try:
                configuration = self._configuration()
            except ValueError as exc:
                log.warning("TLS files changed but cannot be used yet (keeping the current ones): %s", exc)
                return None
            self._seen = signature
            log.info("TLS certificate files changed: new connections use them (%s)",
                     ", ".join(map(str, self._paths())))
            return configuration


@dataclass(frozen=True)
class TLSFiles:
    """PEM files for TLS. `cert`/`key`: this end's certificate chain and private key;
    `ca`: the CA that signed the other end; `mutual`: servers demand client certificates.

    A server needs cert and key (and ca when mutual). A channel needs ca (and cert and
    key when the server demands client certificates).
    """

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None
    mutual: bool = False
    server_name: str = ""  # overrides the name checked in the server's certificate

    def _read(self, what: str) -> bytes | None:
        path = getattr(self, what)
        if path is None:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise ValueError(f"TLS {what} file {path}: {exc.strerror}") from None

    def server_credentials(self) -> grpc.ServerCredentials:
        if self.cert is None or self.key is None:
            raise ValueError("TLS for a server needs both 'cert' and 'key'")
        if self.mutual and self.ca is None:
            raise ValueError("mutual TLS needs 'ca' to check client certificates")
        files = _ServerFiles(self)  # re-read when they change: rotation without a restart
        return grpc.dynamic_ssl_server_credentials(files.initial, files.fetch,
                                                   require_client_authentication=self.mutual)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self._read("ca"),
            private_key=self._read("key"),
            certificate_chain=self._read("cert"),
        )
