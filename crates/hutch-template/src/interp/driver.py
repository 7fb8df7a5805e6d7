"""Hutch's kernel driver: stateful code contexts inside a sandbox.

The `code-interpreter` template runs this program as its start command, from the file the
recipe put in the template, with `--prestart python`: the default Python context's kernel is
started before the driver listens, so the sandbox is ready with its kernel up. Elsewhere the
host (hutch-core's `interp` module) starts it inside the sandbox on the first code call, as
`python3 -u - --port PORT --state-dir DIR` with this source on stdin. The host talks to it
through the agent's TCP tunnel to PORT on the sandbox's loopback. One request
per connection: one JSON line in, JSON lines out (see `docs/code-interpreter.md`).

Languages: `python` through a real Jupyter kernel (ipykernel) driven by the reference
client, `jupyter_client`; `r` through IRkernel the same way, where the template has it (the
`ir` kernelspec); `bash` as a persistent bash process; `javascript` as a persistent
Node.js process running each cell with `vm.runInThisContext`.

The contexts that exist are recorded in DIR/contexts.json, on the sandbox's disk: a driver
started again (after an `ns` wake, in a fork child) knows them, starts their kernels on
first use and reports `context_restarted: true`, since their state is gone.

The host sends this file with one line before it, `NODE_BOOT = "..."`: the source of
node_boot.js (the Node.js side of the `javascript` contexts) as a string.
"""

import abc
import argparse
import asyncio
import codecs
import json
import os
import queue
import re
import secrets
import signal
import sys
import time

PROTOCOL_VERSION = 1
READY_LINE = "hutch-interp ready"
# Longest request line (code and environment).
MAX_REQUEST_BYTES = 8 << 20
# How long an interrupted execution may take to stop before its kernel is restarted.
INTERRUPT_GRACE_S = 5.0
# How long a kernel may take to start (ipykernel takes ~1 s on `ns`, ~45 s in a `vm` guest
# under TCG).
KERNEL_START_TIMEOUT_S = 180.0
# How often a waiting execution checks that its kernel still lives.
POLL_S = 0.2
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
LANGUAGES = ("python", "r", "bash", "javascript")
# MIME types whose data is base64.
BASE64_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp", "application/pdf")
WORK = "/tmp/.hutch-interp"


class Refused(Exception):
    """A request the driver answers with a `failed` line."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


class KernelDied(Exception):
    """The kernel's process ended while running a cell."""


class Output:
    """The events of one execution, written as they come, within the output cap."""

    def __init__(self, writer, cap):
        self.writer = writer
        self.left = cap
        self.truncated = False
        self.error_sent = False
        # The host went away: what is left of the cell is read and dropped.
        self.gone = False

    async def send(self, event):
        if self.gone:
            return
        try:
            self.writer.write((json.dumps(event) + "\n").encode())
            await self.writer.drain()
        except (ConnectionError, RuntimeError):
            self.gone = True

    def _take(self, size):
        if size <= self.left:
            self.left -= size
            return True
        self.truncated = True
        return False

    async def stream(self, name, text):
        if not text:
            return
        data = text.encode("utf-8", "replace")
        if len(data) > self.left:
            self.truncated = True
            data = data[: self.left]
            text = data.decode("utf-8", "ignore")
        if data:
            self.left -= len(data)
            await self.send({"type": name, "text": text})

    async def bundle(self, kind, data, metadata=None, **extra):
        # Base64 in one line (IRkernel breaks it every 76 characters).
        data = {
            k: "".join(v.split()) if k in BASE64_TYPES and isinstance(v, str) else v
            for k, v in data.items()
        }
        size = sum(len(json.dumps(v)) for v in data.values())
        if self._take(size):
            event = {"type": kind, "data": data, "metadata": metadata or {}}
            event.update(extra)
            await self.send(event)

    async def error(self, name, value, traceback=(), timed_out=False):
        self.error_sent = True
        event = {
            "type": "error",
            "name": name,
            "value": value,
            "traceback": [ANSI.sub("", line) for line in traceback],
        }
        if timed_out:
            event["timed_out"] = True
        await self.send(event)


def timeout_value(timeout_s):
    return f"the code ran longer than its timeout of {timeout_s:g} s and was interrupted"


def kernel_env(env):
    merged = dict(os.environ)
    merged.update(env or {})
    return merged


class JupyterKernel(abc.ABC):
    """A Jupyter kernel (its kernelspec `KERNEL_NAME`), driven with jupyter_client's asyncio
    client. Subclasses say how to start it and how to set and restore environment
    variables around a cell in its language."""

    KERNEL_NAME = ""
    WHAT = ""
    # The kernel shows a cell's values as display data, never as an execute result
    # (IRkernel): the last one without an image is then the cell's main result.
    VALUES_AS_DISPLAY = False

    def __init__(self):
        self.km = None
        self.kc = None

    def start_environment(self, env):
        return kernel_env(env)

    def start_arguments(self):
        return []

    async def start(self, cwd, env):
        try:
            from jupyter_client.kernelspec import NoSuchKernel
            from jupyter_client.manager import AsyncKernelManager
        except ImportError as e:
            raise Refused("unavailable", f"python3 has no jupyter_client ({e})")
        km = AsyncKernelManager(kernel_name=self.KERNEL_NAME)
        try:
            await km.start_kernel(
                cwd=cwd or None,
                env=self.start_environment(env),
                extra_arguments=self.start_arguments(),
            )
        except NoSuchKernel:
            raise Refused(
                "unavailable",
                f"this sandbox's template has no {self.WHAT} Jupyter kernel "
                f"(kernelspec {self.KERNEL_NAME!r})",
            )
        except Exception as e:
            raise Refused("unavailable", f"the {self.WHAT} Jupyter kernel did not start: {e}")
        kc = km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=KERNEL_START_TIMEOUT_S)
        except Exception as e:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)
            raise Refused("internal", f"the {self.WHAT} kernel did not become ready: {e}")
        self.km, self.kc = km, kc
        await self.prepare()

    async def prepare(self):
        """Run once the kernel is ready, before its first cell."""

    async def alive(self):
        return self.km is not None and await self.km.is_alive()

    async def stop(self):
        if self.kc is not None:
            self.kc.stop_channels()
        if self.km is not None:
            try:
                await self.km.shutdown_kernel(now=True)
            except Exception:
                pass
        self.km = self.kc = None

    async def _silent(self, code):
        msg_id = self.kc.execute(code, silent=True, store_history=False)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                msg = await self.kc.get_shell_msg(timeout=POLL_S)
            except queue.Empty:
                if not await self.alive():
                    raise KernelDied()
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                return

    @abc.abstractmethod
    def set_env_code(self, env):
        """Code, in the kernel's language, that saves the variables of `env` and sets them."""

    @abc.abstractmethod
    def restore_env_code(self):
        """Code that puts back what `set_env_code` saved."""

    async def execute(self, code, env, timeout_s, out):
        kc = self.kc
        if env:
            await self._silent(self.set_env_code(env))
        try:
            return await self._run(code, timeout_s, out)
        finally:
            if env:
                # Queued behind the cell (the kernel runs requests in order), even when the
                # host left mid-cell; its reply is not waited for.
                kc.execute(self.restore_env_code(), silent=True, store_history=False)

    async def _run(self, code, timeout_s, out):
        kc = self.kc
        msg_id = kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=False)
        start = time.monotonic()
        deadline = start + timeout_s if timeout_s else None
        interrupted_at = None
        count = None
        # VALUES_AS_DISPLAY: the latest value shown, sent once the next output comes (as
        # display data) or the cell ends (as its main result).
        held = None

        async def flush(as_result=False):
            nonlocal held
            if held is not None:
                data, metadata = held
                held = None
                if as_result:
                    await out.bundle("result", data, metadata, is_main_result=True)
                else:
                    await out.bundle("display", data, metadata, display_id=None, update=False)

        while True:
            now = time.monotonic()
            if deadline and interrupted_at is None and now >= deadline:
                await self.km.interrupt_kernel()
                interrupted_at = now
            if interrupted_at is not None and now - interrupted_at > INTERRUPT_GRACE_S:
                await out.error(
                    "TimeoutError",
                    timeout_value(timeout_s)
                    + "; it did not stop on the interrupt, so its kernel was restarted "
                    "(its state is lost)",
                    timed_out=True,
                )
                raise KernelDied()
            try:
                msg = await kc.get_iopub_msg(timeout=POLL_S)
            except queue.Empty:
                if not await self.alive():
                    raise KernelDied()
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if self.VALUES_AS_DISPLAY and kind == "display_data":
                data = content.get("data", {})
                transient = content.get("transient") or {}
                if not transient.get("display_id") and not any(
                    k.startswith("image/") for k in data
                ):
                    await flush()
                    held = (data, content.get("metadata"))
                    continue
            if kind in ("stream", "execute_result", "display_data", "update_display_data", "error"):
                await flush()
            if kind == "stream":
                await out.stream(content.get("name", "stdout"), content.get("text", ""))
            elif kind == "execute_input":
                count = content.get("execution_count", count)
            elif kind == "execute_result":
                count = content.get("execution_count", count)
                await out.bundle(
                    "result", content.get("data", {}), content.get("metadata"),
                    is_main_result=True,
                )
            elif kind in ("display_data", "update_display_data"):
                display_id = (content.get("transient") or {}).get("display_id")
                await out.bundle(
                    "display", content.get("data", {}), content.get("metadata"),
                    display_id=display_id, update=kind == "update_display_data",
                )
            elif kind == "error":
                if interrupted_at is not None and content.get("ename") == "KeyboardInterrupt":
                    await out.error("TimeoutError", timeout_value(timeout_s), timed_out=True)
                else:
                    await out.error(
                        content.get("ename", "Error"),
                        content.get("evalue", ""),
                        content.get("traceback", []),
                    )
            elif kind == "status" and content.get("execution_state") == "idle":
                await flush(as_result=True)
                break
        if interrupted_at is not None and not out.error_sent:
            await out.error("TimeoutError", timeout_value(timeout_s), timed_out=True)
        return await self._reply_count(msg_id, count)

    async def _reply_count(self, msg_id, count):
        """Read the cell's reply off the shell channel (it comes before the kernel goes
        idle), so replies never pile up there; its execution count is the kernel's own."""
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            try:
                msg = await self.kc.get_shell_msg(timeout=POLL_S)
            except queue.Empty:
                break
            if msg["parent_header"].get("msg_id") == msg_id:
                return msg["content"].get("execution_count", count)
        return count


class PythonKernel(JupyterKernel):
    """An ipykernel."""

    KERNEL_NAME = "python3"
    WHAT = "python3"

    def start_environment(self, env):
        environment = kernel_env(env)
        # Charts come back as images: matplotlib's inline backend sends each figure as
        # display data (the template's MPLBACKEND=Agg would draw them nowhere).
        if "MPLBACKEND" not in (env or {}):
            environment["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
        return environment

    def start_arguments(self):
        # No history database: `In`, `Out` and `_` stay (in memory), and a cell costs ~25%
        # less without its SQLite write.
        return ["--HistoryManager.enabled=False"]

    def set_env_code(self, env):
        return (
            "import os as __hutch_os\n"
            f"__hutch_env = {{k: __hutch_os.environ.get(k) for k in {list(env)!r}}}\n"
            f"__hutch_os.environ.update({env!r})\n"
        )

    def restore_env_code(self):
        return (
            "for __hutch_k, __hutch_v in __hutch_env.items():\n"
            "    if __hutch_v is None: __hutch_os.environ.pop(__hutch_k, None)\n"
            "    else: __hutch_os.environ[__hutch_k] = __hutch_v\n"
            "del __hutch_env, __hutch_os\n"
        )


def r_string(text):
    """`text` as an R string literal (JSON's escapes are R's)."""
    return json.dumps(text)


class RKernel(JupyterKernel):
    """IRkernel (Debian's r-cran-irkernel registers the `ir` kernelspec)."""

    KERNEL_NAME = "ir"
    WHAT = "R"
    VALUES_AS_DISPLAY = True

    async def prepare(self):
        # Plots as PNG (what a model can see) next to text, at a size a chat shows whole.
        await self._silent(
            "options(jupyter.plot_mimetypes = c('text/plain', 'image/png'), "
            "repr.plot.width = 7, repr.plot.height = 5, repr.plot.res = 100)"
        )

    def set_env_code(self, env):
        names = ", ".join(r_string(k) for k in env)
        values = ", ".join(f"{r_string(k)} = {r_string(v)}" for k, v in env.items())
        return (
            f".hutch_env <- Sys.getenv(c({names}), unset = NA, names = TRUE)\n"
            f"do.call(Sys.setenv, list({values}))\n"
        )

    def restore_env_code(self):
        return (
            "for (.hutch_k in names(.hutch_env)) {\n"
            "  if (is.na(.hutch_env[[.hutch_k]])) Sys.unsetenv(.hutch_k)\n"
            "  else do.call(Sys.setenv, setNames(list(.hutch_env[[.hutch_k]]), .hutch_k))\n"
            "}\n"
            "rm(.hutch_env, .hutch_k)\n"
        )


class ProcessKernel:
    """A persistent interpreter process of our own (bash, node), in its own session so an
    interrupt reaches what it started."""

    def __init__(self):
        self.proc = None
        self.count = 0
        # Readers of a cell the host left: they read its output up to its end, so the next
        # cell starts on a clean stream.
        self.pending = []

    async def alive(self):
        if self.pending:
            _, late = await asyncio.wait(self.pending, timeout=INTERRUPT_GRACE_S)
            self.pending = []
            if late:
                for reader in late:
                    reader.cancel()
                await self.stop()
        return self.proc is not None and self.proc.returncode is None

    async def wait_cell(self, readers, timeout_s):
        """Wait for a cell's readers (see `wait_or_interrupt`); when the host goes away,
        interrupt the cell and leave its readers to finish in the background."""
        try:
            return await wait_or_interrupt(readers, timeout_s, self)
        except asyncio.CancelledError:
            self.interrupt()
            self.pending = [r for r in readers if not r.done()]
            raise

    async def stop(self):
        if self.proc is not None and self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await self.proc.wait()
        self.proc = None

    def interrupt(self):
        try:
            os.killpg(self.proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass


class BashKernel(ProcessKernel):
    """`bash` reading commands from a pipe; each cell is a file it sources, so variables,
    functions, `cd` and exports stay. An interrupt (SIGINT to its session) returns from the
    sourced cell through a trap, keeping the shell."""

    async def start(self, cwd, env):
        self.dir = os.path.join(WORK, "bash-" + secrets.token_hex(6))
        os.makedirs(self.dir, exist_ok=True)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                "bash", "--noprofile", "--norc",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd=cwd or None, env=kernel_env(env),
                start_new_session=True,
            )
        except (FileNotFoundError, NotADirectoryError) as e:
            raise Refused("unavailable", f"bash did not start: {e}")
        await self._send("trap 'return 130 2>/dev/null' INT\n")

    async def _send(self, text):
        self.proc.stdin.write(text.encode())
        await self.proc.stdin.drain()

    async def execute(self, code, env, timeout_s, out):
        self.count += 1
        cell = os.path.join(self.dir, "cell.sh")
        with open(cell, "w") as f:
            f.write(code + "\n")
        mark = "__hutch_done_" + secrets.token_hex(8) + "_"
        prelude = "".join(
            f"__hutch_old_{i}=${{{k}-__hutch_unset}}; export {k}={shell_quote(v)}; "
            for i, (k, v) in enumerate(env.items())
        )
        restore = "".join(
            f"if [ \"$__hutch_old_{i}\" = __hutch_unset ]; then unset {k}; "
            f"else export {k}=\"$__hutch_old_{i}\"; fi; unset __hutch_old_{i}; "
            for i, k in enumerate(env)
        )
        await self._send(
            f"{prelude}source {shell_quote(cell)} </dev/null; __hutch_s=$?; {restore}"
            f"printf '%s%d\\n' {mark} \"$__hutch_s\"; printf '%s\\n' {mark} >&2\n"
        )
        results = {}
        readers = [
            asyncio.ensure_future(self._relay(self.proc.stdout, "stdout", mark, out, results)),
            asyncio.ensure_future(self._relay(self.proc.stderr, "stderr", mark, out, results)),
        ]
        interrupted = await self.wait_cell(readers, timeout_s)
        if "stdout" not in results:
            if interrupted:
                await out.error(
                    "TimeoutError",
                    timeout_value(timeout_s) + "; it did not stop on the interrupt, so its "
                    "shell was restarted (its state is lost)",
                    timed_out=True,
                )
            raise KernelDied()
        status = results["stdout"]
        if interrupted:
            await out.error("TimeoutError", timeout_value(timeout_s), timed_out=True)
        elif status != 0:
            await out.error("ExitStatus", f"the last command exited with status {status}")
        return self.count

    async def _relay(self, pipe, name, mark, out, results):
        """Send what `pipe` gives until the mark, and note the status after it."""
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        pending = b""
        token = mark.encode()
        keep = len(token) - 1
        while True:
            chunk = await pipe.read(65536)
            if not chunk:
                await out.stream(name, decoder.decode(pending, final=True))
                return
            pending += chunk
            at = pending.find(token)
            if at >= 0:
                await out.stream(name, decoder.decode(pending[:at], final=True))
                rest = pending[at + len(token):]
                while b"\n" not in rest:
                    more = await pipe.read(64)
                    if not more:
                        break
                    rest += more
                digits = rest.split(b"\n", 1)[0]
                results[name] = int(digits) if digits.isdigit() else 0
                return
            # Keep what could be the start of the mark; send the rest.
            if len(pending) > keep:
                send, pending = pending[:-keep], pending[-keep:]
                await out.stream(name, decoder.decode(send))




class NodeKernel(ProcessKernel):
    """Node.js running each cell in its global context (`vm.runInThisContext`): globals and
    top-level declarations stay; the last expression's value is the result."""

    async def start(self, cwd, env):
        read_fd, write_fd = os.pipe()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                "node", "-e", NODE_BOOT, "--", str(write_fd),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd=cwd or None, env=kernel_env(env),
                start_new_session=True, pass_fds=(write_fd,),
            )
        except (FileNotFoundError, NotADirectoryError) as e:
            os.close(read_fd)
            raise Refused("unavailable", f"node did not start: {e}")
        finally:
            os.close(write_fd)
        loop = asyncio.get_running_loop()
        self.control = asyncio.StreamReader(limit=MAX_REQUEST_BYTES * 4)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(self.control), os.fdopen(read_fd, "rb")
        )

    async def execute(self, code, env, timeout_s, out):
        self.count += 1
        request = {"code": code, "env": env, "count": self.count,
                   "timeout_ms": int(timeout_s * 1000) if timeout_s else 0}
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        await self.proc.stdin.drain()
        done = {}
        readers = [
            asyncio.ensure_future(self._control(out, done)),
            asyncio.ensure_future(self._pipe(self.proc.stdout, "stdout", out, done)),
            asyncio.ensure_future(self._pipe(self.proc.stderr, "stderr", out, done)),
        ]
        # Node enforces the timeout itself; this one only catches a process that hangs.
        try:
            await self.wait_cell(readers[:1], timeout_s + INTERRUPT_GRACE_S if timeout_s else 0)
        finally:
            for reader in readers[1:]:
                reader.cancel()
        if "done" not in done:
            raise KernelDied()
        if done.get("timeout"):
            await out.error("TimeoutError", timeout_value(timeout_s), timed_out=True)
        return self.count

    async def _control(self, out, done):
        while True:
            raw = await self.control.readline()
            if not raw:
                return
            event = json.loads(raw)
            kind = event["type"]
            if kind == "done":
                done["done"] = True
                return
            if kind == "timeout":
                done["timeout"] = True
            elif kind in ("stdout", "stderr"):
                await out.stream(kind, event["text"])
            elif kind == "result":
                await out.bundle("result", {"text/plain": event["text"]}, is_main_result=True)
            elif kind == "error":
                await out.error(event["name"], event["value"], event["traceback"])

    async def _pipe(self, pipe, name, out, done):
        while "done" not in done:
            chunk = await pipe.read(65536)
            if not chunk:
                return
            await out.stream(name, chunk.decode("utf-8", "replace"))


async def wait_or_interrupt(readers, timeout_s, kernel):
    """Wait for `readers`; past the timeout interrupt the kernel once and give it the grace
    time. True when it was interrupted."""
    interrupted = False
    deadline = timeout_s or None
    while True:
        done, _ = await asyncio.wait(readers, timeout=deadline)
        if len(done) == len(readers):
            for reader in done:
                reader.result()
            return interrupted
        if interrupted:
            for reader in readers:
                reader.cancel()
            await kernel.stop()
            return interrupted
        kernel.interrupt()
        interrupted = True
        deadline = INTERRUPT_GRACE_S


def shell_quote(text):
    return "'" + text.replace("'", "'\\''") + "'"


KERNELS = {"python": PythonKernel, "r": RKernel, "bash": BashKernel, "javascript": NodeKernel}


class Context:
    def __init__(self, id, language, cwd, env):
        self.id, self.language, self.cwd, self.env = id, language, cwd, env
        self.kernel = None
        # Its kernel's state was lost (a driver started again, a kernel that died): the next
        # execution says so.
        self.restarted = False
        self.lock = asyncio.Lock()

    def view(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def record(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd, "env": self.env}

    async def ensure_kernel(self):
        if self.kernel is not None and await self.kernel.alive():
            return
        if self.kernel is not None:
            # It died between calls (killed from elsewhere): its state is gone.
            await self.kernel.stop()
            self.kernel = None
            self.restarted = True
        kernel = KERNELS[self.language]()
        await kernel.start(self.cwd, self.env)
        self.kernel = kernel


class Driver:
    def __init__(self, state_dir):
        self.registry = os.path.join(state_dir, "contexts.json")
        self.contexts = {}
        # Held while a default context is made, so concurrent first calls make one.
        self.making_default = asyncio.Lock()
        try:
            with open(self.registry) as f:
                records = json.load(f).get("contexts", [])
        except (OSError, ValueError):
            records = []
        for r in records:
            if r.get("language") in KERNELS and isinstance(r.get("id"), str):
                ctx = Context(r["id"], r["language"], r.get("cwd"), r.get("env") or {})
                ctx.restarted = True
                self.contexts[ctx.id] = ctx

    def save(self):
        os.makedirs(os.path.dirname(self.registry), exist_ok=True)
        tmp = self.registry + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"version": PROTOCOL_VERSION,
                       "contexts": [c.record() for c in self.contexts.values()]}, f)
        os.replace(tmp, self.registry)

    def context(self, request):
        context_id = request.get("context_id")
        if context_id is None:
            return None
        ctx = self.contexts.get(context_id)
        if ctx is None:
            raise Refused("not_found", f"context {context_id} does not exist")
        return ctx

    async def create(self, language, cwd, env, context_id=None):
        if language not in KERNELS:
            raise Refused("invalid", f"unknown language {language!r}")
        if cwd and not os.path.isdir(cwd):
            raise Refused("invalid", f"cwd {cwd} is not a directory in the sandbox")
        ctx = Context(context_id or "ctx_" + secrets.token_hex(8), language, cwd, env or {})
        async with ctx.lock:
            await ctx.ensure_kernel()
        self.contexts[ctx.id] = ctx
        self.save()
        return ctx

    async def handle(self, request, writer):
        op = request.get("op")
        if op == "create_context":
            ctx = await self.create(request.get("language") or "python",
                                    request.get("cwd"), request.get("env"))
            return {"type": "ok", "context": ctx.view()}
        if op == "list":
            return {"type": "ok", "contexts": [c.view() for c in self.contexts.values()]}
        if op == "restart":
            ctx = self.context(request) or self._missing()
            async with ctx.lock:
                if ctx.kernel is not None:
                    await ctx.kernel.stop()
                    ctx.kernel = None
                await ctx.ensure_kernel()
                ctx.restarted = False
            return {"type": "ok", "context": ctx.view()}
        if op == "delete":
            ctx = self.context(request) or self._missing()
            self.contexts.pop(ctx.id, None)
            self.save()
            if ctx.kernel is not None:
                await ctx.kernel.stop()
            return {"type": "ok"}
        if op == "interrupt":
            ctx = self.context(request) or self._missing()
            if ctx.kernel is not None:
                if isinstance(ctx.kernel, PythonKernel):
                    await ctx.kernel.km.interrupt_kernel()
                else:
                    ctx.kernel.interrupt()
            return {"type": "ok"}
        if op == "execute":
            await self.execute(request, writer)
            return None
        raise Refused("invalid", f"unknown op {op!r}")

    def _missing(self):
        raise Refused("invalid", "context_id is required")

    async def default_context(self, language):
        """The default context of `language`, made (its kernel started) if there is none."""
        default_id = "default-" + language
        async with self.making_default:
            ctx = self.contexts.get(default_id)
            if ctx is None:
                ctx = await self.create(language, None, {}, context_id=default_id)
        return ctx

    async def prestart(self, language):
        """Start the default context's kernel now, before any call needs it. A context
        recorded by an earlier driver keeps saying its state was lost (`restarted`)."""
        ctx = await self.default_context(language)
        async with ctx.lock:
            await ctx.ensure_kernel()

    async def execute(self, request, writer):
        ctx = self.context(request)
        if ctx is None:
            language = request.get("language") or "python"
            if language not in KERNELS:
                raise Refused("invalid", f"unknown language {language!r}")
            ctx = await self.default_context(language)
        out = Output(writer, int(request.get("output_cap") or (16 << 20)))
        timeout_s = (request.get("timeout_ms") or 0) / 1000
        async with ctx.lock:
            started = time.monotonic()
            await ctx.ensure_kernel()
            restarted, ctx.restarted = ctx.restarted, False
            count = None
            try:
                count = await ctx.kernel.execute(
                    request.get("code", ""), request.get("env") or {}, timeout_s, out)
            except KernelDied:
                if not out.error_sent:
                    await out.error(
                        "KernelDied",
                        f"the {ctx.language} kernel exited while running the code; its state "
                        "is lost, and the next call starts a new one",
                    )
                await ctx.kernel.stop()
                ctx.kernel = None
                ctx.restarted = True
            except (ConnectionError, asyncio.CancelledError):
                # The host went away: stop the cell rather than let it run unseen.
                if ctx.kernel is not None and isinstance(ctx.kernel, PythonKernel):
                    await ctx.kernel.km.interrupt_kernel()
                elif ctx.kernel is not None:
                    ctx.kernel.interrupt()
                raise
            await out.send({
                "type": "end",
                "execution_count": count,
                "duration_ms": int((time.monotonic() - started) * 1000),
                "context_id": ctx.id,
                "context_restarted": restarted,
                "truncated": out.truncated,
            })


async def until_host_leaves(work, reader):
    """Run `work` while the host's side of the connection stays open (the host sends one
    line and nothing more; end of stream means it went away): then cancel it."""
    work = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(reader.read(1))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not work.done():
            work.cancel()
        gone.cancel()
    return await work


async def serve_connection(driver, reader, writer):
    try:
        raw = await reader.readline()
        if not raw:
            return
        try:
            request = json.loads(raw)
            if not isinstance(request, dict):
                raise ValueError("not an object")
            answer = await until_host_leaves(driver.handle(request, writer), reader)
        except Refused as e:
            answer = {"type": "failed", "code": e.code, "message": e.message}
        except ValueError as e:
            answer = {"type": "failed", "code": "invalid", "message": f"bad request: {e}"}
        except (ConnectionError, asyncio.CancelledError):
            return
        except Exception as e:  # a bug here must not end the driver
            answer = {"type": "failed", "code": "internal", "message": f"{type(e).__name__}: {e}"}
        if answer is not None:
            writer.write((json.dumps(answer) + "\n").encode())
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--prestart", action="append", default=[], choices=sorted(KERNELS),
                        help="start this language's default context before listening")
    args = parser.parse_args()
    os.makedirs(WORK, exist_ok=True)
    # Jupyter's connection files and IPython's profile go to the sandbox's /tmp, not $HOME.
    os.environ.setdefault("JUPYTER_RUNTIME_DIR", os.path.join(WORK, "runtime"))
    os.environ.setdefault("IPYTHONDIR", os.path.join(WORK, "ipython"))
    driver = Driver(args.state_dir)
    for language in args.prestart:
        try:
            await driver.prestart(language)
        except Exception as e:  # the first call starts it (and reports why it cannot)
            print(f"hutch-interp: the {language} kernel did not start: {type(e).__name__}: {e}",
                  file=sys.stderr, flush=True)
    server = await asyncio.start_server(
        lambda r, w: serve_connection(driver, r, w), "127.0.0.1", args.port,
        limit=MAX_REQUEST_BYTES,
    )
    print(f"{READY_LINE} {PROTOCOL_VERSION}", flush=True)
    # Nothing more goes to the host's exec stream: the driver's own complaints go to a log.
    log = os.open(os.path.join(WORK, "driver.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except OSError as e:
        print(f"hutch-interp: {e}", file=sys.stderr, flush=True)
        sys.exit(4)
