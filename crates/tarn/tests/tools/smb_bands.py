#!/usr/bin/env python3
"""A Time Machine-like workload over SMB, for tests/smb.rs.

Writes band files of a sparse bundle (8 MiB each, in 1 MiB writes) into a
share with Python's smbprotocol, a real SMB2/3 client, and sends an SMB2
FLUSH after each band, as macOS does for Time Machine (F_FULLFSYNC). After a
band's FLUSH has been answered it prints "flushed N" and flushes stdout, so
the test knows which bands the server promised to keep. It then goes on
with the next band until it is killed or the connection drops.

usage: smb_bands.py HOST PORT SHARE USER PASSWORD COUNT
Band N holds bytes that depend on N and the position (see band_bytes).
"""
import sys
import uuid

from smbprotocol.connection import Connection
from smbprotocol.open import (CreateDisposition, CreateOptions, FileAttributes,
                              FilePipePrinterAccessMask, ImpersonationLevel, Open,
                              ShareAccess)
from smbprotocol.session import Session
from smbprotocol.tree import TreeConnect

BAND = 8 << 20
CHUNK = 1 << 20


def band_bytes(n, off, length):
    """The bytes of band n at off: a byte pattern keyed by band and offset."""
    base = bytes((i * 7 + n * 31) & 0xFF for i in range(251))
    start = (off + n) % 251
    reps = (length + start) // 251 + 2
    return (base * reps)[start:start + length]


def main():
    host, port, share, user, password, count = sys.argv[1:7]
    conn = Connection(uuid.uuid4(), host, int(port))
    conn.connect()
    sess = Session(conn, user, password, require_encryption=False)
    sess.connect()
    tree = TreeConnect(sess, r"\\%s\%s" % (host, share))
    tree.connect()
    d = Open(tree, "bands")
    d.create(ImpersonationLevel.Impersonation,
             FilePipePrinterAccessMask.GENERIC_READ | FilePipePrinterAccessMask.GENERIC_WRITE,
             FileAttributes.FILE_ATTRIBUTE_DIRECTORY,
             ShareAccess.FILE_SHARE_READ | ShareAccess.FILE_SHARE_WRITE,
             CreateDisposition.FILE_OPEN_IF,
             CreateOptions.FILE_DIRECTORY_FILE)
    d.close()
    for n in range(int(count)):
        f = Open(tree, "bands\\%x" % n)
        f.create(ImpersonationLevel.Impersonation,
                 FilePipePrinterAccessMask.GENERIC_READ | FilePipePrinterAccessMask.GENERIC_WRITE,
                 FileAttributes.FILE_ATTRIBUTE_NORMAL,
                 ShareAccess.FILE_SHARE_READ,
                 CreateDisposition.FILE_OVERWRITE_IF,
                 CreateOptions.FILE_NON_DIRECTORY_FILE)
        for off in range(0, BAND, CHUNK):
            f.write(band_bytes(n, off, CHUNK), off)
        f.flush()
        print("flushed %d" % n, flush=True)
        f.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
