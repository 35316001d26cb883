"""A tar shard indexed as its bytes stream in: the member headers parsed as they arrive.

`TarScan` is fed the bytes of a download in order (``feed(pos, piece)``, as each
piece is written to the local file); it reads each 512-byte ustar header as it
arrives and keeps the small ``.cls`` members' values, so when the last byte lands
the shard's index is ready without reading the file again. Anything it does not
handle (pax or GNU long-name headers, base-256 sizes, a bad checksum, a cut
shard, bytes out of order) makes it give up (``ok`` False): the shard is then
indexed from the file (`tar.index_tar`), which also names the fault.
"""

from __future__ import annotations

LABEL_BYTES = 32  # a ``.cls`` member longer than this is no label (as `tar._labels`)


class TarScan:
    """The members of one tar shard of ``size`` bytes, from its bytes in order."""

    def __init__(self, size: int):
        self.size = size
        self.ok = True
        self.seen = 0  # bytes fed so far (in order)
        self.next_header = 0  # where the next header starts
        self.header = b""  # the part of the next header that has arrived
        self.done = False  # the end-of-archive block was read
        self.end = 0  # where the last member's data ends
        #: (name, data offset, size) of each regular file
        self.members: list[tuple[str, int, int]] = []
        #: data offset -> bytes of each small ``.cls`` member
        self.labels: dict[int, bytes] = {}
        self._capture: tuple[int, int] | None = None

    def feed(self, pos: int, data: bytes | memoryview) -> None:
        """Bytes ``[pos, pos + len(data))`` of the shard; pieces must come in order."""
        if not self.ok:
            return
        if pos != self.seen:
            self.ok = False
            return
        n = len(data)
        self.seen += n
        off = 0
        while off < n and self.ok:
            here = pos + off
            if self.done:  # after the end-of-archive block, only zero bytes may follow
                if bytes(data[off:]).strip(b"\0"):
                    self.ok = False
                return
            if here < self.next_header:  # member data or padding
                stop = min(n, self.next_header - pos)
                cap = self._capture
                if cap is not None:
                    a, b = max(here, cap[0]), min(pos + stop, cap[1])
                    if a < b:
                        self.labels[cap[0]] = self.labels.get(cap[0], b"") + bytes(
                            data[a - pos : b - pos]
                        )
                off = stop
                continue
            take = bytes(data[off : off + 512 - len(self.header)])
            self.header += take
            off += len(take)
            if len(self.header) == 512:
                self._read_header(self.header)
                self.header = b""

    def _read_header(self, header: bytes) -> None:
        if header == bytes(512):
            self.done = True
            return
        if header[257:262] != b"ustar" or header[156:157] in b"xgLKS" or header[124] & 0x80:
            self.ok = False  # pax, GNU long names, base-256 sizes: `tarfile` reads them
            return
        try:
            checksum = int(header[148:156].split(b"\0", 1)[0].strip() or b"0", 8)
            n = int(header[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
        except ValueError:
            self.ok = False
            return
        if checksum != sum(header) - sum(header[148:156]) + 256:
            self.ok = False
            return
        name = header[0:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix.decode("utf-8", "surrogateescape") + "/" + name
        start = self.next_header + 512
        if start + n > self.size:
            self.ok = False  # cut: `index_tar` names the member
            return
        if header[156:157] in (b"0", b"\0", b"7"):
            self.members.append((name, start, n))
            small = name.lower().endswith(".cls") and n <= LABEL_BYTES
            self._capture = (start, start + n) if small and n else None
        else:
            self._capture = None
        self.end = start + n
        self.next_header = start + n + (-n % 512)

    def result(self) -> tuple[list[tuple[str, int, int]], int, dict[int, bytes]] | None:
        """(members, where they end, ``.cls`` values by data offset) once every byte came
        in and the shard read cleanly; else None (index it from the file)."""
        if not self.ok or self.seen != self.size:
            return None
        if not self.done and self.header.strip(b"\0"):  # a cut header after the last member
            return None
        return self.members, self.end, self.labels
