"""A host holding many sockets to a server and reopening each one the server closes (issue 33:
one address holding 10,000+ sockets made everyone else's requests take 3-5 s).

    python -m tests.integration.socket_holder HOST PORT COUNT SOURCE_ADDRESS

Prints ``held`` once COUNT connections are started, then runs until its stdin is closed and
prints how many it reopened. It raises its own open-file limit (to COUNT + 200).
"""

from __future__ import annotations

import resource
import selectors
import socket
import sys


def hold(host: str, port: int, count: int, source: str) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count + 200
    if hard != resource.RLIM_INFINITY and hard < wanted:
        raise SystemExit(f"the open-file hard limit ({hard}) is below {wanted}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    selector = selectors.DefaultSelector()

    def open_one() -> None:
        sock = socket.socket()
        sock.setblocking(False)
        sock.bind((source, 0))
        sock.connect_ex((host, port))
        selector.register(sock, selectors.EVENT_READ)

    for _ in range(count):
        open_one()
    print("held", flush=True)
    selector.register(sys.stdin, selectors.EVENT_READ)
    reopened = 0
    while True:
        for key, _ in selector.select(1.0):
            if key.fileobj is sys.stdin:
                return reopened
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(4096)
            except OSError:
                data = b""
            if not data:
                selector.unregister(sock)
                sock.close()
                open_one()
                reopened += 1


if __name__ == "__main__":
    host, port, count, source = sys.argv[1:5]
    print(hold(host, int(port), int(count), source), flush=True)
