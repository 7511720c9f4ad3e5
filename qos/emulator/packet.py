"""One packet as the emulator sees it: parsed IPv4 header fields plus bookkeeping.

The NFQUEUE runner copies only the first bytes of each packet from the kernel
(`HEADER_BYTES`), so the length comes from the IPv4 header's total-length field,
never from the size of the copied buffer.
"""

from __future__ import annotations

import struct

# Enough for an IPv4 header with options (60 bytes) plus the TCP/UDP ports.
HEADER_BYTES = 64

PROTO_TCP = 6
PROTO_UDP = 17
PROTO_SCTP = 132
_PORT_PROTOCOLS = (PROTO_TCP, PROTO_UDP, PROTO_SCTP)


class MalformedPacket(ValueError):
    """Bytes that are not a parseable IPv4 header."""


class Packet:
    """A packet in flight through an emulated link.

    Attributes
    ----------
    length : int
        IP total length in bytes (what the link serialises, before L2 overhead).
    dscp : int
        DiffServ code point, 0-63.
    flow : tuple
        (src, dst, protocol, sport, dport); addresses as 4-byte `bytes`, ports 0 when absent.
    klass : str
        Name of the class the link's classifier assigned (set by `EmulatedLink.enqueue`).
    arrival : float
        Virtual time (s) at which the packet reached the link.
    handle : object
        Whatever the caller needs to release the packet later (the NFQUEUE packet).
    station : str
        On a shared medium: the direction (sender) it came in by, which has its own queue.
    """

    __slots__ = ("length", "dscp", "flow", "klass", "arrival", "handle", "station")

    def __init__(self, length: int, dscp: int = 0, flow: tuple = (), handle=None):
        self.length = int(length)
        self.dscp = int(dscp)
        self.flow = flow
        self.klass = ""
        self.arrival = 0.0
        self.handle = handle
        self.station = ""

    def __repr__(self) -> str:
        return f"Packet(length={self.length}, dscp={self.dscp}, klass={self.klass!r})"


def parse_ipv4(data: bytes, handle=None) -> Packet:
    """Parse the start of an IPv4 packet.

    Parameters
    ----------
    data : bytes
        At least the IPv4 header (20-60 bytes); the transport ports are read when present.
    handle : object, optional
        Stored on the returned packet (e.g. the NFQUEUE packet to give a verdict on later).

    Returns
    -------
    Packet
        With `length` from the total-length field, `dscp` from the TOS byte and `flow`
        the 5-tuple (ports 0 for protocols without ports or for non-first fragments).

    Raises
    ------
    MalformedPacket
        When the bytes are too short, not IPv4, or the header length is impossible.
    """
    if len(data) < 20:
        raise MalformedPacket(f"{len(data)} bytes is shorter than an IPv4 header (20)")
    version_ihl, tos, total_length, _ident, frag = struct.unpack_from("!BBHHH", data, 0)
    if version_ihl >> 4 != 4:
        raise MalformedPacket(f"IP version {version_ihl >> 4}, expected 4")
    header_length = (version_ihl & 0x0F) * 4
    if header_length < 20 or total_length < header_length:
        raise MalformedPacket(
            f"header length {header_length} / total length {total_length} are inconsistent")
    protocol = data[9]
    src, dst = data[12:16], data[16:20]
    sport = dport = 0
    first_fragment = (frag & 0x1FFF) == 0
    if protocol in _PORT_PROTOCOLS and first_fragment and len(data) >= header_length + 4:
        sport, dport = struct.unpack_from("!HH", data, header_length)
    return Packet(total_length, tos >> 2, (src, dst, protocol, sport, dport), handle)


def build_ipv4_header(length: int = 1500, dscp: int = 0, protocol: int = PROTO_TCP,
                      src: bytes = b"\x0a\x00\x00\x01", dst: bytes = b"\x0a\x00\x00\x02",
                      sport: int = 5000, dport: int = 5201, ecn: int = 0) -> bytes:
    """The first 24 bytes of an IPv4 packet (header without options, then the ports).

    The inverse of `parse_ipv4`, for tests and benchmarks that feed the emulator
    synthetic packets. The checksum is left zero (nothing here checks it).
    """
    header = struct.pack("!BBHHHBBH4s4s", 0x45, (dscp << 2) | ecn, length, 1, 0x4000, 64,
                         protocol, 0, src, dst)
    return header + struct.pack("!HH", sport, dport)
