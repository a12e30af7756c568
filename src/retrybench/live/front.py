"""nginx as a front load balancer: its configuration and command line, written in one place.

A deployment runs the overload-control proxy as several instances behind a load balancer. Two fronts
matter to coalescing (docs/replicas.md): `key-affine`, nginx's consistent hashing of the
Idempotency-Key header (`hash $http_idempotency_key consistent`, ngx_http_upstream_hash_module, built
into every nginx package), so every attempt of a call reaches the same instance; and `round-robin`,
nginx's default, which spreads a call's attempts over the instances as an L4 balancer would. The
proxy-overhead benchmark uses the same configuration with one upstream, as its reference proxy.

Streams pass unbuffered both ways, on keep-alive upstream connections; a client that leaves closes
its upstream connection (nginx's default), which is how a client's departure reaches the proxy. A
failed attempt is never re-sent to another instance (`proxy_next_upstream off`): retrying is the
client's decision, and the experiment counts it.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

__all__ = ["FRONTS", "nginx_binary", "nginx_command", "nginx_conf"]

FRONTS = {"key-affine": "hash $http_idempotency_key consistent;", "round-robin": ""}
NGINX_PATHS = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")


def nginx_binary() -> str | None:
    """The nginx executable on PATH or in a usual place (distributions put it in /usr/sbin), or None."""
    return shutil.which("nginx") or next((p for p in NGINX_PATHS if Path(p).exists()), None)


def nginx_conf(workdir: Path, listen: int, upstreams: Sequence[int], *, front: str = "round-robin",
               host: str = "127.0.0.1", keepalive: int = 256) -> Path:
    """Write workdir/nginx.conf: one worker listening on host:`listen`, in front of the servers on
    host:`upstreams`, balanced by `front` (a key of FRONTS); every file it writes stays in workdir."""
    if front not in FRONTS:
        raise ValueError(f"unknown front {front!r}; known: {', '.join(FRONTS)}")
    if not upstreams:
        raise ValueError("nginx needs at least one upstream")
    balance = FRONTS[front]
    servers = " ".join(f"server {host}:{port};" for port in upstreams)
    conf = workdir / "nginx.conf"
    conf.write_text(f"""
worker_processes 1;
daemon off;
pid {workdir}/nginx.pid;
error_log {workdir}/error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {workdir}/body;
  proxy_temp_path {workdir}/proxy;
  fastcgi_temp_path {workdir}/fastcgi;
  uwsgi_temp_path {workdir}/uwsgi;
  scgi_temp_path {workdir}/scgi;
  upstream backends {{ {balance} {servers} keepalive {keepalive}; }}
  server {{
    listen {host}:{listen} backlog=4096;
    location / {{
      proxy_pass http://backends;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_next_upstream off;
      proxy_read_timeout 3600s;
      proxy_send_timeout 3600s;
    }}
  }}
}}
""")
    return conf


def nginx_command(binary: str, conf: Path) -> list[str]:
    """The command that runs nginx in the foreground on `conf`, its prefix the config's directory."""
    return [binary, "-c", str(conf), "-p", str(conf.parent)]
