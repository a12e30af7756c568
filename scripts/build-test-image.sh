#!/usr/bin/env bash
# Build the container tests' stand-in for the vLLM image, with no registry: a static busybox and a
# `vllm` shell script in a 2 MB root filesystem, loaded by `docker import`.
#
#   scripts/build-test-image.sh [IMAGE]      (default: retrybench/fake-vllm:test)
#
# Its entrypoint is `vllm serve`, as in vllm/vllm-openai, so the container code runs unchanged: the
# stand-in prints its arguments and environment (the log the tests read back), checks that the
# retrybench source is mounted on PYTHONPATH, waits FAKE_VLLM_DELAY_S (default 1 s) so the readiness
# wait has something to wait for, then serves /health (and a stub /v1/models) with busybox httpd on
# --port (default 8000), logging each request; FAKE_VLLM_EXIT=N makes it exit with status N instead
# (a vLLM that fails to load its model). busybox comes from the busybox binary on PATH if it is
# static, else from the distribution's busybox-static package, downloaded and unpacked here (apt-get
# download, after refreshing the package index if it has none; nothing is installed).
set -euo pipefail
image="${1:-retrybench/fake-vllm:test}"
work="$(mktemp -d)"
chmod 755 "$work"
mkdir -m 777 "$work/dl"  # apt-get download writes as the _apt user
trap 'rm -rf "$work"' EXIT

busybox="$(command -v busybox || true)"
if [ -z "$busybox" ] || ! file -L "$busybox" 2>/dev/null | grep -q 'statically linked'; then
  # The package index may be empty on a machine that cleaned it after its last install: refresh it then.
  (cd "$work/dl" && { apt-get download -q busybox-static >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get download -q busybox-static >/dev/null; }; })
  dpkg-deb -x "$work"/dl/busybox-static_*.deb "$work/deb"
  busybox="$work/deb/bin/busybox"
fi

root="$work/root"
mkdir -p "$root/bin" "$root/tmp" "$root/www/v1"
cp "$busybox" "$root/bin/busybox"
for tool in sh echo ls sleep mkdir cat env; do ln -s busybox "$root/bin/$tool"; done
echo ok >"$root/www/health"
echo '{"object":"list","data":[]}' >"$root/www/v1/models"
cat >"$root/bin/vllm" <<'SH'
#!/bin/sh
# Stand-in for `vllm serve MODEL [ARGS]`: see scripts/build-test-image.sh.
echo "fake-vllm argv: $*"
echo "fake-vllm env: PYTHONPATH=${PYTHONPATH:-} HF_HOME=${HF_HOME:-}"
if [ -n "${FAKE_VLLM_EXIT:-}" ]; then
  echo "fake-vllm: exiting with status $FAKE_VLLM_EXIT before serving"
  exit "$FAKE_VLLM_EXIT"
fi
source_dir="${PYTHONPATH%%:*}"
if [ -n "$source_dir" ] && [ -d "$source_dir/retrybench" ]; then
  echo "fake-vllm: retrybench source mounted at $source_dir"
fi
port=8000
while [ $# -gt 0 ]; do
  if [ "$1" = "--port" ] && [ $# -gt 1 ]; then port="$2"; fi
  shift
done
sleep "${FAKE_VLLM_DELAY_S:-1}"
echo "fake-vllm: serving /health on port $port"
exec /bin/busybox httpd -f -v -p "$port" -h /www
SH
chmod +x "$root/bin/vllm"

tar -C "$root" -c . | docker import --change 'ENTRYPOINT ["/bin/vllm", "serve"]' --change 'EXPOSE 8000' \
  --message "retrybench container-test stand-in for vllm/vllm-openai" - "$image" >/dev/null
echo "built $image ($(docker image inspect "$image" --format '{{.Size}}') bytes)"
