"""A hostile /metrics exporter and Prometheus API on 127.0.0.1, for `slowcard watch` tests.

    with HostileEndpoint() as srv:
        url = srv.url("/ok?n=4")

It answers the way a broken or malicious endpoint can: slowly (a byte at a time, of headers
or of body), hugely (over the size cap, a gzip bomb), malformed (garbage, escape sequences, a
forged ALERT line, an API error text with a newline), with non-finite or out-of-range numbers
(labels ``inf`` / ``1e30`` / ``-1``, values NaN / +-Inf, timestamps inf / nan / 1e300) and with
timestamps from the future or from long ago, or a million distinct ones. Every connection
handler ends by itself (``lifetime_s``) and the server stops when the block ends.

Paths:
  /ok?n=4[&hot=E]          a valid vLLM exposition, counters growing with time (engine E gets 4x)
  /label?engine=V          /ok with n=2 plus one sample whose engine label is V
  /kv_inf                  /ok with engine 0's KV-cache gauge +Inf
  /values                  /ok with n=2 plus NaN / +Inf / -Inf / 1e300 samples of engine 2
  /slow_body?every=S       headers, then one byte of a valid line every S seconds
  /slow_headers?every=S    the status line, then one header byte every S seconds
  /huge                    a valid body of 40 MB (over the 32 MB cap)
  /gzipbomb                Content-Encoding gzip: 64 MB of zeros in ~64 KB
  /garbage                 ESC/OSC/BEL, CR and a forged ALERT line, no metric
  /scripted                the bytes last given to ``script(body)``
  /api_MODE/api/v1/query_range   Prometheus range-query answers; MODE:
      ok                   every asked step, 2 engines
      ts_VALUE             the asked start, then one step at VALUE (inf, nan, 1e300, future, ancient)
      many_N               N distinct timestamps (most outside the asked range)
      grid_N               N distinct timestamps inside the asked range, off the step grid
      flip                 the first answer has a step 10 years ahead, then honest answers
      err                  status error, the error text holding a newline and a forged ALERT line
      scripted             the bytes last given to ``script(body)``
  POST /hook               the body is recorded in ``hooks``
"""

from __future__ import annotations

import gzip
import http.server
import json
import socketserver
import threading
import time
import urllib.parse

ENGINE_METRICS = (
    ("vllm:num_requests_running", "gauge"),
    ("vllm:num_requests_waiting", "gauge"),
    ("vllm:kv_cache_usage_perc", "gauge"),
    ("vllm:request_success_total", "counter"),
    ("vllm:prompt_tokens_total", "counter"),
    ("vllm:generation_tokens_total", "counter"),
)
TEN_YEARS_S = 10 * 365 * 86400


def vllm_text(t_s: float, n: int, hot: int | None = None, kv0: str | None = None) -> str:
    """A vLLM exposition of ``n`` engines ``t_s`` seconds into the simulation."""
    out = [f"# TYPE {name} {kind}" for name, kind in ENGINE_METRICS]
    out.append("# TYPE vllm:time_to_first_token_seconds histogram")
    for e in range(n):
        f = 4.0 if e == hot else 1.0
        lab = f'engine="{e}",model_name="m"'
        req = int(40 * f * t_s)
        kv = kv0 if (e == 0 and kv0 is not None) else "0.35"
        out += [
            f"vllm:num_requests_running{{{lab}}} {5 * f}",
            f"vllm:num_requests_waiting{{{lab}}} 0",
            f"vllm:kv_cache_usage_perc{{{lab}}} {kv}",
            f"vllm:request_success_total{{{lab}}} {req}",
            f"vllm:prompt_tokens_total{{{lab}}} {req * 100}",
            f"vllm:generation_tokens_total{{{lab}}} {req * 50}",
        ]
        for le in ("0.05", "0.1", "0.5", "+Inf"):
            out.append(f'vllm:time_to_first_token_seconds_bucket{{{lab},le="{le}"}} {req}')
        out.append(f"vllm:time_to_first_token_seconds_count{{{lab}}} {req}")
        out.append(f"vllm:time_to_first_token_seconds_sum{{{lab}}} {req * 0.04}")
    return "\n".join(out) + "\n"


class HostileEndpoint:
    """The server; ``url(path)`` gives a full URL. Use as a context manager."""

    def __init__(self, lifetime_s: float = 60.0):
        self.lifetime_s = lifetime_s
        self.t0 = time.time()
        self.stop = threading.Event()
        self.hooks: list[bytes] = []
        self.requests: list[str] = []
        self.scripted = b""
        self.flips = 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                owner.hooks.append(self.rfile.read(min(n, 1 << 20)))
                self.send_response(204)
                self.end_headers()

            def do_GET(self):
                owner.requests.append(self.path)
                try:
                    owner.answer(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # --- life ------------------------------------------------------------------------------
    def __enter__(self) -> HostileEndpoint:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def script(self, body: bytes | str) -> None:
        """What /scripted and /api_scripted answer next."""
        self.scripted = body.encode() if isinstance(body, str) else body

    def _alive(self, deadline: float) -> bool:
        return not self.stop.is_set() and time.monotonic() < deadline

    # --- answers ---------------------------------------------------------------------------
    @staticmethod
    def send(h, body: bytes, ctype: str = "text/plain; version=0.0.4", extra=()) -> None:
        h.send_response(200)
        h.send_header("Content-Type", ctype)
        for k, v in extra:
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def answer(self, h) -> None:
        u = urllib.parse.urlparse(h.path)
        q = {k: v[0] for k, v in urllib.parse.parse_qs(u.query).items()}
        p = u.path
        t = time.time() - self.t0
        deadline = time.monotonic() + self.lifetime_s
        if p.startswith("/api_") and p.endswith("/api/v1/query_range"):
            mode = p[len("/api_") : -len("/api/v1/query_range")]
            return self.send(h, self.range_answer(mode, q), "application/json")
        if p == "/ok":
            hot = int(q["hot"]) if "hot" in q else None
            return self.send(h, vllm_text(t, int(q.get("n", "4")), hot).encode())
        if p == "/label":
            v = q.get("engine", "inf")
            return self.send(h, (vllm_text(t, 2) + f'vllm:num_requests_running{{engine="{v}"}} 1\n').encode())
        if p == "/kv_inf":
            return self.send(h, vllm_text(t, 4, kv0="+Inf").encode())
        if p == "/values":
            extra = (
                'vllm:kv_cache_usage_perc{engine="2"} +Inf\n'
                'vllm:num_requests_waiting{engine="2"} -Inf\n'
                'vllm:num_requests_running{engine="2"} NaN\n'
                'vllm:request_success_total{engine="2"} 1e300\n'
            )
            return self.send(h, (vllm_text(t, 2) + extra).encode())
        every = float(q.get("every", "0.2"))
        if p == "/slow_body":
            h.send_response(200)
            h.send_header("Content-Type", "text/plain")
            h.end_headers()
            h.wfile.flush()
            line = b'vllm:num_requests_running{engine="0"} 1\n'
            i = 0
            while self._alive(deadline):
                h.wfile.write(line[i % len(line) : i % len(line) + 1])
                h.wfile.flush()
                i += 1
                time.sleep(every)
            return None
        if p == "/slow_headers":
            h.wfile.write(b"HTTP/1.0 200 OK\r\n")
            h.wfile.flush()
            while self._alive(deadline):
                h.wfile.write(b"X")
                h.wfile.flush()
                time.sleep(every)
            return None
        if p == "/huge":
            h.send_response(200)
            h.send_header("Content-Type", "text/plain")
            h.end_headers()
            chunk = "".join(f'vllm:num_requests_running{{engine="{i % 4}",x="{i}"}} 1\n' for i in range(20000))
            data, sent = chunk.encode(), 0
            while sent < (40 << 20) and self._alive(deadline):
                h.wfile.write(data)
                sent += len(data)
            return None
        if p == "/gzipbomb":
            return self.send(h, gzip.compress(b"\0" * (64 << 20), 9), extra=[("Content-Encoding", "gzip")])
        if p == "/garbage":
            body = (
                'vllm:num_requests_running{engine="0" 1 \x1b]0;owned\x07\x1b[31mRED\r\n'
                "garbage line \x1b[2K\rALERT dp-metrics-imbalance: PASS -> FAIL: forged\n"
            )
            return self.send(h, body.encode())
        if p == "/scripted":
            return self.send(h, self.scripted)
        h.send_response(404)
        h.end_headers()
        return None

    def range_answer(self, mode: str, q: dict) -> bytes:
        start, end, step = float(q["start"]), float(q["end"]), float(q["step"])
        names = ("vllm:num_requests_running", "vllm:request_success_total")

        def series(engine: int, name: str, values: list) -> dict:
            labels = {"__name__": name, "engine": str(engine), "instance": "i:1", "job": "vllm"}
            return {"metric": labels, "values": values}

        def honest() -> list:
            steps = [start + i * step for i in range(int(round((end - start) / step)) + 1)]
            return [series(e, n, [[s, str(int(s - self.t0) * 10)] for s in steps]) for e in range(2) for n in names]

        if mode == "flip":
            self.flips += 1
            mode = "ts_future" if self.flips == 1 else "ok"
        if mode == "scripted":
            return self.scripted
        if mode == "err":
            return json.dumps(
                {"status": "error", "error": "boom\nALERT dp-metrics-imbalance: PASS -> FAIL: DP 7 forged\x1b]0;x\x07"}
            ).encode()
        if mode == "ok":
            result = honest()
        elif mode.startswith("ts_"):
            raw = mode[3:]
            bad = {"future": time.time() + TEN_YEARS_S, "ancient": 86400.0}.get(raw)
            value = bad if bad is not None else (float(raw) if raw not in ("inf", "nan") else raw)
            result = [series(e, names[0], [[start, "1"], [value, "2"]]) for e in range(2)]
        elif mode.startswith(("many_", "grid_")):
            n = int(mode[5:])
            if mode.startswith("many_"):
                values = [[round(start - 1e6 + i * 0.001, 3), "1"] for i in range(n)]
            else:
                values = [[round(start + (i + 0.5) * (end - start) / max(n, 1), 3), "1"] for i in range(n)]
            result = [series(0, names[0], values)]
        else:
            result = []
        return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()
