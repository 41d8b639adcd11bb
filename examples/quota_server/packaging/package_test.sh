#!/usr/bin/env bash
# quota_server_package_test: builds quota-server's Debian package from the build tree
# (cpack -G DEB, cmake/QuotaPackage.cmake), checks its metadata and contents, and runs the
# binary from the unpacked package with a packaged rule file: --help, then a server that
# answers /healthz and a check. Everything under a scratch directory, the server stopped
# by pid. Usage: package_test.sh BUILD_DIR
set -euo pipefail
build=$1
work=$(mktemp -d /tmp/quota_package_XXXXXX)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAILED: $*"; exit 1; }

cpack -G DEB --config "$build/CPackConfig.cmake" -B "$work/out" >"$work/cpack.log" 2>&1 ||
  { cat "$work/cpack.log"; fail "cpack"; }
deb=$(ls "$work"/out/quota-server_*.deb) || fail "no quota-server_*.deb in $(ls "$work/out")"
info=$(dpkg-deb --info "$deb")
grep -q "Package: quota-server" <<<"$info" || fail "package name: $info"
grep -q "Depends:.*libgrpc++" <<<"$info" || fail "dependencies not read from the binary: $info"
dpkg-deb -x "$deb" "$work/root"
root=$work/root
for f in usr/bin/quota-server usr/lib/systemd/system/quota-server.service \
         usr/share/quota-server/rules/shared-tenant-budget.yaml \
         usr/share/quota-server/nginx/quota.conf.in; do
  [ -e "$root/$f" ] || fail "$f missing from the package"
done
grep -q "^ExecStart=/usr/bin/quota-server " "$root/usr/lib/systemd/system/quota-server.service" ||
  fail "the unit does not start /usr/bin/quota-server"
help=$("$root/usr/bin/quota-server" --help) || fail "--help exits non-zero"
grep -q "usage: quota-server" <<<"$help" || fail "--help: $help"

"$root/usr/bin/quota-server" --rules "$root/usr/share/quota-server/rules/shared-tenant-budget.yaml" \
  --default-plan free --grpc-port 0 --http-port 0 >"$work/server.log" 2>&1 &
pid=$!
for _ in $(seq 100); do
  grep -q "http listening" "$work/server.log" && break
  sleep 0.1
done
port=$(sed -n 's/^http listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$work/server.log")
[ -n "$port" ] || { cat "$work/server.log"; fail "the packaged server did not start"; }
request() {  # METHOD PATH [BODY]: the answer's status line and body
  exec 3<>"/dev/tcp/127.0.0.1/$port"
  printf '%s %s HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' \
    "$1" "$2" "${#3}" "$3" >&3
  timeout 10 cat <&3
  exec 3<&-
}
health=$(request GET /healthz "")
grep -q "^HTTP/1.[01] 200 " <<<"$health" || fail "/healthz: $health"
answer=$(request POST /v1/check '{"tenant":"acme","route":"read"}')
grep -q '"allowed":' <<<"$answer" || fail "a check: $answer"
echo "package $(basename "$deb"): $(wc -c <"$deb") bytes, installed and served"
echo "1 passed, 0 failed"
