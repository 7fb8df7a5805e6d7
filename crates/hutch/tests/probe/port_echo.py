"""The service behind the port-forwarding tests; runs inside a sandbox (template `base`).

usage: python3 port_echo.py PORT [v6]

- any method on /echo: answers the request body back, with the request's content type
- any other method and path: answers JSON describing the request as the service saw it
  (method, path with query, headers, body length)
- GET /ws with `Upgrade: websocket`: a WebSocket echo (text, binary, ping, close), with
  the handshake and framing written out here (standard library only)

Binds 127.0.0.1:PORT, or [::1]:PORT with `v6`.
"""

import base64
import hashlib
import json
import socket
import struct
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def answer(self, status, content_type, data, extra=()):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def handle_any(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self.websocket()
        body = self.read_body()
        if self.path.split("?")[0] == "/echo":
            content_type = self.headers.get("Content-Type", "application/octet-stream")
            return self.answer(200, content_type, body, [("X-Echo-Method", self.command)])
        seen = {
            "method": self.command,
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body_len": len(body),
        }
        self.answer(200, "application/json", json.dumps(seen).encode(), [("X-Served-By", "port_echo")])

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = handle_any

    def websocket(self):
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            opcode = head[0] & 0x0F
            length = head[1] & 0x7F
            if length == 126:
                length = struct.unpack("!H", self.rfile.read(2))[0]
            elif length == 127:
                length = struct.unpack("!Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            data = self.rfile.read(length)
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
            if opcode == 8:
                self.send_frame(8, payload[:2])
                return
            if opcode == 9:
                self.send_frame(10, payload)
            elif opcode in (1, 2):
                self.send_frame(opcode, payload)

    def send_frame(self, opcode, payload):
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, n)
        elif n < 65536:
            head = struct.pack("!BBH", 0x80 | opcode, 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 127, n)
        self.wfile.write(head + payload)
        self.wfile.flush()


class V6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


def main():
    port = int(sys.argv[1])
    if len(sys.argv) > 2 and sys.argv[2] == "v6":
        V6Server(("::1", port), Handler).serve_forever()
    else:
        ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
