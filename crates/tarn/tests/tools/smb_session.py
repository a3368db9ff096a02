#!/usr/bin/env python3
"""One SMB session held across an account change, for tests/smb.rs.

Logs in with Python's smbprotocol, a real SMB2/3 client, prints "ready"
and waits for a line on stdin; then connects to the share again on the
same session (as Windows and macOS clients do after a share's connection
was closed) and prints "connected" or "refused: REASON".

usage: smb_session.py HOST PORT SHARE USER PASSWORD
"""
import sys
import uuid

from smbprotocol.connection import Connection
from smbprotocol.session import Session
from smbprotocol.tree import TreeConnect


def main():
    host, port, share, user, password = sys.argv[1:6]
    conn = Connection(uuid.uuid4(), host, int(port))
    conn.connect(timeout=10)
    sess = Session(conn, user, password, require_encryption=False)
    sess.connect()
    TreeConnect(sess, r"\\%s\%s" % (host, share)).connect()
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        TreeConnect(sess, r"\\%s\%s" % (host, share)).connect()
        print("connected", flush=True)
    except Exception as e:  # the session is gone: any error says so
        print("refused: %s" % type(e).__name__, flush=True)


if __name__ == "__main__":
    main()
