"""Test hosts of the "fake internet" namespace built by crates/hutch/tests/network.rs.

Runs inside that namespace only (the test creates it; its only link leads to the test's
world namespace). Serves:
  203.0.113.10:80    HTTP, answers "plain host=<Host>"
  203.0.113.20:80    HTTP, answers "shared host=<Host>"
  203.0.113.20:443   TLS with a certificate per SNI (good.test + *.good.test, bad.test),
                     answers "tls sni=<name>"
  169.254.169.254:80 a fake cloud metadata service, answers "metadata"
  203.0.113.10:3333  a fake mining pool (raw TCP), sends "mined"
  203.0.113.10:3000  raw TCP, sends "hello3000"
  203.0.113.10:7000  raw TCP, sends "tick" every 100 ms until the peer goes away
  203.0.113.53:53    DNS (UDP) for the test zone; the A record of slow.test comes SLOW
                     seconds late (its AAAA answer at once), and each query for it is
                     counted in the file <certs dir>/asked-slow.test
Prints "ready" once every socket is bound.
"""
import socket
import ssl
import struct
import sys
import threading
import time

CERTS = sys.argv[1]
ZONE = {
    "good.test": "203.0.113.20",
    "api.good.test": "203.0.113.20",
    "www.good.test": "203.0.113.20",
    "bad.test": "203.0.113.20",
    "plain.test": "203.0.113.10",
    "rebind.test": "10.0.0.5",
    "meta.test": "169.254.169.254",
    "slow.test": "203.0.113.10",
}
SLOW = 1.5


def listen(ip, port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((ip, port))
    s.listen(64)
    return s


def serve(sock, handle):
    def loop():
        while True:
            c, _ = sock.accept()
            threading.Thread(target=guard, args=(handle, c), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()


def guard(handle, c):
    try:
        handle(c)
    except Exception:
        pass
    finally:
        try:
            c.close()
        except Exception:
            pass


def read_head(c):
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 65536:
        chunk = c.recv(4096)
        if not chunk:
            break
        data += chunk
    host = ""
    for line in data.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"host":
            host = v.strip().decode()
    return host


def http(label):
    def handle(c):
        host = read_head(c)
        body = f"{label} host={host}\n".encode()
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))

    return handle


def raw(text):
    def handle(c):
        c.sendall(text)

    return handle


def ticker(c):
    while True:
        c.sendall(b"tick\n")
        time.sleep(0.1)


def tls_server():
    contexts = {}
    for name in ("good", "bad"):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(f"{CERTS}/{name}.crt", f"{CERTS}/{name}.key")
        contexts[name] = ctx
    default = contexts["good"]
    seen = {}

    def pick(sslsock, name, _ctx):
        seen[id(sslsock)] = name
        if name == "bad.test":
            sslsock.context = contexts["bad"]

    default.sni_callback = pick
    sock = listen("203.0.113.20", 443)

    def handle(c):
        s = default.wrap_socket(c, server_side=True)
        read_head(s)
        body = f"tls sni={seen.get(id(s), '')}\n".encode()
        s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        s.close()

    serve(sock, handle)


def dns():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("203.0.113.53", 53))

    def loop():
        while True:
            q, peer = s.recvfrom(512)
            try:
                i, labels = 12, []
                while q[i]:
                    labels.append(q[i + 1 : i + 1 + q[i]].decode().lower())
                    i += 1 + q[i]
                qtype = struct.unpack(">H", q[i + 1 : i + 3])[0]
                end = i + 5
                name = ".".join(labels)
                ip = ZONE.get(name)
                flags = 0x8180 if ip else 0x8183
                answers = b""
                count = 0
                if ip and qtype == 1:
                    count = 1
                    answers = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + socket.inet_aton(ip)
                head = q[:2] + struct.pack(">HHHHH", flags, 1, count, 0, 0)
                reply = head + q[12:end] + answers
                if name == "slow.test":
                    with open(f"{CERTS}/asked-slow.test", "a") as f:
                        f.write(f"{qtype}\n")
                if name == "slow.test" and qtype == 1:
                    threading.Timer(SLOW, s.sendto, args=(reply, peer)).start()
                else:
                    s.sendto(reply, peer)
            except Exception:
                pass

    threading.Thread(target=loop, daemon=True).start()


serve(listen("203.0.113.10", 80), http("plain"))
serve(listen("203.0.113.20", 80), http("shared"))
serve(listen("169.254.169.254", 80), http("metadata"))
serve(listen("203.0.113.10", 3333), raw(b"mined\n"))
serve(listen("203.0.113.10", 3000), raw(b"hello3000\n"))
serve(listen("203.0.113.10", 7000), ticker)
tls_server()
dns()
print("ready", flush=True)
while True:
    time.sleep(3600)
