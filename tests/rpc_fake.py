"""A fake llama.cpp RPC worker in Python (the wire format of ggml-rpc.cpp), answering with a
chosen protocol version: for the probe's tests and the version-mismatch test."""

from __future__ import annotations

import socket
import struct
import threading

from localinfer.hardware import rpc


class FakeWorker:
    """Listens on a free loopback port; each connection gets HELLO with ``version``, then
    device count, device memory, alignment, buffer commands. ``busy``: accepts and never
    answers (a worker serving another client)."""

    def __init__(self, version: tuple[int, int, int] = rpc.PROTOCOL, *, devices: int = 1,
                 free: int = 3 << 30, total: int = 4 << 30, busy: bool = False,
                 hello_size: int = rpc.HELLO_REPLY_SIZE) -> None:
        self.version, self.devices, self.free, self.total = version, devices, free, total
        self.busy, self.hello_size = busy, hello_size
        self.commands: list[int] = []
        self.bytes_set = 0
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(4)
        self.port = self._sock.getsockname()[1]
        self.endpoint = f"127.0.0.1:{self.port}"
        self._held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            if self.busy:
                self._held.append(conn)
                continue
            with conn:
                try:
                    self._session(conn)
                except (OSError, ConnectionError, struct.error):
                    pass

    def _recv(self, conn: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise ConnectionError
            data += chunk
        return data

    def _reply(self, conn: socket.socket, payload: bytes) -> None:
        conn.sendall(struct.pack("<Q", len(payload)) + payload)

    def _session(self, conn: socket.socket) -> None:
        while True:
            cmd, size = struct.unpack("<BQ", self._recv(conn, 9))
            payload = self._recv(conn, size)
            self.commands.append(cmd)
            if cmd == rpc.CMD_HELLO:
                body = bytes(self.version) + bytes(1 + rpc.CONN_CAPS_SIZE)
                self._reply(conn, body[: self.hello_size].ljust(self.hello_size, b"\0"))
                if self.version[0] != rpc.PROTOCOL[0]:
                    return
            elif cmd == rpc.CMD_DEVICE_COUNT:
                self._reply(conn, struct.pack("<I", self.devices))
            elif cmd == rpc.CMD_GET_DEVICE_MEMORY:
                self._reply(conn, struct.pack("<QQ", self.free, self.total))
            elif cmd == rpc.CMD_GET_ALIGNMENT:
                self._reply(conn, struct.pack("<Q", 32))
            elif cmd == rpc.CMD_ALLOC_BUFFER:
                _, n = struct.unpack("<IQ", payload)
                self._reply(conn, struct.pack("<QQ", 0x1000, n))
            elif cmd == rpc.CMD_BUFFER_GET_BASE:
                self._reply(conn, struct.pack("<Q", 0x2000))
            elif cmd == rpc.CMD_SET_TENSOR:
                self.bytes_set += len(payload) - 296 - 9
            elif cmd == rpc.CMD_FREE_BUFFER:
                pass
            else:
                return

    def close(self) -> None:
        self._sock.close()
        for conn in self._held:
            conn.close()
