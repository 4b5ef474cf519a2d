# Sourced by bench/query and bench/ingest for `--table s3://…`: starts moto's S3-compatible
# server (from the test venv; scripts/test installs moto[server]) behind bench/src/bin/
# latency_proxy.rs, which adds TOOLSPAN_BENCH_LATENCY_MS (default 20) to every request, creates
# the bucket of the URI, and exports the AWS_* environment toolspan reads. Skipped when
# AWS_ENDPOINT_URL is already set (a real store). Needs: $VENV, $CARGO_TARGET_DIR, $1 = the URI.
s3_bench_start() {
  local uri="$1"
  [ -n "${AWS_ENDPOINT_URL:-}" ] && return 0
  "$VENV/bin/python" -c 'import moto' 2>/dev/null ||
    "$VENV/bin/pip" install -q --disable-pip-version-check -r tests/s3/requirements.txt
  cargo build --release -q -p toolspan-bench --bin latency_proxy
  local free='import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
  local moto_port proxy_port bucket
  moto_port=$(python3 -c "$free")
  proxy_port=$(python3 -c "$free")
  S3_WORK="$(mktemp -d)"
  "$VENV/bin/python" -m moto.server -H 127.0.0.1 -p "$moto_port" >"$S3_WORK/moto.log" 2>&1 &
  S3_PIDS="$!"
  for _ in $(seq 300); do (echo >/dev/tcp/127.0.0.1/$moto_port) 2>/dev/null && break; sleep 0.1; done
  export TOOLSPAN_BENCH_LATENCY_MS="${TOOLSPAN_BENCH_LATENCY_MS:-20}"
  "$CARGO_TARGET_DIR/release/latency_proxy" "$proxy_port" "127.0.0.1:$moto_port" "$TOOLSPAN_BENCH_LATENCY_MS" >"$S3_WORK/proxy.log" 2>&1 &
  S3_PIDS="$S3_PIDS $!"
  for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$proxy_port) 2>/dev/null && break; sleep 0.1; done
  bucket=$(sed -E 's#^s3a?://([^/]+).*#\1#' <<<"$uri")
  curl -fsS -X PUT "http://127.0.0.1:$moto_port/$bucket" -o /dev/null
  export AWS_ENDPOINT_URL="http://127.0.0.1:$proxy_port" AWS_ALLOW_HTTP=true AWS_REGION=us-east-1 \
    AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench-secret
  echo "bench: S3 server (moto) on :$moto_port behind a ${TOOLSPAN_BENCH_LATENCY_MS} ms latency proxy on :$proxy_port" >&2
}

s3_bench_stop() {
  [ -n "${S3_PIDS:-}" ] && kill $S3_PIDS 2>/dev/null
  [ -n "${S3_WORK:-}" ] && rm -rf "$S3_WORK"
  return 0
}
