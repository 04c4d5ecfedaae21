"""A TCP proxy on 127.0.0.1 that adds a fixed one-way delay in each direction (this kernel has no netem).

Each chunk read from one side is held until the time it was read plus the one-way delay, then written to
the other side, in order. Reads are never held back (the socket buffers are large and the queue unbounded),
so the link has the delay and no bandwidth limit of its own: what a transfer reaches through it is what its
windows allow at that round-trip time. The proxy is its own process; `cpu_seconds()` says what it used, to
show it is not the bottleneck.

    python bench/delay_proxy.py LISTEN_PORT TARGET_PORT RTT_MS
"""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

BUF = 16 << 20  # socket buffers: far above any window a single ssh channel opens
READ = 1 << 20


def _tune(s: socket.socket) -> None:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        s.setsockopt(socket.SOL_SOCKET, opt, BUF)


class _Pipe:
    """One direction of one connection: a reader stamping chunks, a writer releasing them when due."""

    def __init__(self, src: socket.socket, dst: socket.socket, delay: float):
        self.src, self.dst, self.delay = src, dst, delay
        self.queue: deque[tuple[float, bytes]] = deque()
        self.ready = threading.Condition()
        self.eof = False

    def read(self) -> None:
        try:
            while data := self.src.recv(READ):
                with self.ready:
                    self.queue.append((time.monotonic() + self.delay, data))
                    self.ready.notify()
        except OSError:
            pass
        with self.ready:
            self.eof = True
            self.ready.notify()

    def write(self) -> None:
        try:
            while True:
                with self.ready:
                    while not self.queue and not self.eof:
                        self.ready.wait()
                    if not self.queue:
                        break
                    due, data = self.queue[0]
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                with self.ready:
                    self.queue.popleft()
                self.dst.sendall(data)
            self.dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _serve(conn: socket.socket, target_port: int, delay: float) -> None:
    up = socket.create_connection(("127.0.0.1", target_port))
    for s in (conn, up):
        _tune(s)
    pipes = [_Pipe(conn, up, delay), _Pipe(up, conn, delay)]
    threads = [threading.Thread(target=f, daemon=True) for p in pipes for f in (p.read, p.write)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    conn.close()
    up.close()


def serve(listen_port: int, target_port: int, rtt_ms: float) -> None:
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _tune(lsock)  # accepted sockets inherit the buffers (and the window scale they allow)
    lsock.bind(("127.0.0.1", listen_port))
    lsock.listen(128)
    print("ready", flush=True)
    sel = selectors.DefaultSelector()
    sel.register(lsock, selectors.EVENT_READ)
    while True:
        sel.select()
        conn, _ = lsock.accept()
        threading.Thread(target=_serve, args=(conn, target_port, rtt_ms / 2000), daemon=True).start()


class DelayProxy:
    """The proxy as a child process: `with DelayProxy(target_port, rtt_ms) as p:` connect to p.port."""

    def __init__(self, target_port: int, rtt_ms: float):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(self.port),
                                      str(target_port), str(rtt_ms)], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("delay proxy did not start")

    def cpu_seconds(self) -> float:
        """CPU seconds the proxy has used so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def __enter__(self) -> "DelayProxy":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))
