"""Network checks run inside a sandbox by crates/hutch/tests/network.rs (python3 of `base`).

  client.py resolve NAME          -> "ok IP..." | "err ..."
  client.py http HOST IP PORT     -> first response line + body | "err ..."
  client.py tls SNI IP            -> body of a TLS request with that SNI | "err ..."
  client.py tcp IP PORT           -> first bytes | "err ..."
  client.py hold IP PORT SECS     -> "ticks N ended REASON" after the stream ends or SECS pass
  client.py sameid NAME           -> "order T1 T2": query types of the replies, in arrival
                                     order, to an A then an AAAA query for NAME sent at once
                                     with one ID from one socket (as busybox nslookup may)
"""
import socket
import ssl
import struct
import sys
import time

T = 3


def main(a):
    if a[0] == "resolve":
        return "ok " + " ".join(sorted({i[4][0] for i in socket.getaddrinfo(a[1], 80, socket.AF_INET)}))
    if a[0] == "http":
        s = socket.create_connection((a[2], int(a[3])), timeout=T)
        s.sendall(f"GET / HTTP/1.1\r\nHost: {a[1]}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while True:
            c = s.recv(4096)
            if not c:
                break
            data += c
        head, _, body = data.partition(b"\r\n\r\n")
        return head.split(b"\r\n")[0].decode() + " | " + body.decode().strip()
    if a[0] == "tls":
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        s = ctx.wrap_socket(socket.create_connection((a[2], 443), timeout=T), server_hostname=a[1])
        s.sendall(f"GET / HTTP/1.1\r\nHost: {a[1]}\r\n\r\n".encode())
        data = b""
        while True:
            c = s.recv(4096)
            if not c:
                break
            data += c
        return data.partition(b"\r\n\r\n")[2].decode().strip()
    if a[0] == "tcp":
        s = socket.create_connection((a[1], int(a[2])), timeout=T)
        return s.recv(100).decode().strip()
    if a[0] == "hold":
        s = socket.create_connection((a[1], int(a[2])), timeout=T)
        s.settimeout(1)
        ticks, end = 0, time.time() + float(a[3])
        reason = "timeout"
        while time.time() < end:
            try:
                c = s.recv(100)
            except socket.timeout:
                reason = "stalled"
                break
            except OSError as e:
                reason = type(e).__name__
                break
            if not c:
                reason = "eof"
                break
            ticks += c.count(b"tick")
            with open("/tmp/ticks", "w") as f:
                f.write(str(ticks))
        return f"ticks {ticks} ended {reason}"
    if a[0] == "sameid":
        ns = next(l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver"))
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(T + 2)
        s.connect((ns, 53))
        name = b"".join(bytes([len(l)]) + l.encode() for l in a[1].split(".")) + b"\0"
        for qtype in (1, 28):
            s.send(struct.pack(">HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0) + name + struct.pack(">HH", qtype, 1))
        types = []
        for _ in range(2):
            r = s.recv(4096)
            i = 12 + len(name)
            types.append(str(struct.unpack(">H", r[i : i + 2])[0]))
        return "order " + " ".join(types)
    return "usage"


try:
    print(main(sys.argv[1:]))
except Exception as e:
    print(f"err {type(e).__name__}: {e}")
