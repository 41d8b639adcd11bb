#!/usr/bin/env bash
# The README's set-up commands, on a fresh Debian 12 machine:
#
#   bash cmake/run.sh demo   — install what is missing, build the simulator, run it
#   bash cmake/run.sh test   — install what is missing, build, run every test
#
# Also: `bash cmake/run.sh test asan|tsan|release` (other presets), `bash cmake/run.sh
# bench` (release build, benchmarks as JSON into build/release/bench/), `bash cmake/run.sh
# fuzz` (clang++ and libFuzzer: each fuzz target of QUOTA_FUZZ_TARGETS, all by default,
# under UBSan for QUOTA_FUZZ_SECONDS, 60 by
# default, from its corpus fuzz/corpus/<target>/; new inputs go to build/fuzz/corpus/,
# a failing input to build/fuzz/crash-*). Debian packages
# are installed with apt-get as root, with sudo otherwise; nothing else is downloaded.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(cmake make g++ pkg-config libabsl-dev catch2 libbenchmark-dev libhiredis-dev
          redis-server redis-sentinel redis-tools libcpp-httplib-dev libyaml-cpp-dev
          libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc nginx dpkg-dev
          lua5.1 libnginx-mod-http-lua python3 golang-go libgtest-dev prometheus)

install_missing() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "quota: installing Debian packages: ${missing[*]}"
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

build() {
  cmake --preset "$1" >/dev/null
  cmake --build --preset "$1"
}

what=${1:-}
preset=${2:-}
case "$what" in
  demo)
    # Extra arguments go to the simulator (try: bash cmake/run.sh demo --help).
    shift
    # Builds only what it runs: the simulator (and what it links), else the first
    # quickstart.
    install_missing
    cmake --preset release >/dev/null
    dir=build/release/examples
    if cmake --build --preset release --target gateway_sim; then
      exec "$dir/gateway_sim/gateway_sim" "$@"
    fi
    echo "quota: gateway_sim did not build; running quickstart-010-token-bucket instead" >&2
    cmake --build --preset release --target quickstart-010-token-bucket
    exec "$dir/quickstart/quickstart-010-token-bucket"
    ;;
  test)
    install_missing
    build "${preset:-dev}"
    ctest --preset "${preset:-dev}"
    ;;
  bench)
    install_missing
    build release
    mkdir -p build/release/bench
    for b in build/release/benchmarks/*_bench; do
      echo "== $b"
      "$b" --benchmark_format=console --benchmark_out="build/release/bench/$(basename "$b").json" \
           --benchmark_out_format=json
    done
    ;;
  fuzz)
    packages+=(clang libfuzzer-14-dev)
    install_missing
    cmake -S . -B build/fuzz -DQUOTA_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ -DQUOTA_BUILD_TESTS=OFF \
          -DQUOTA_BUILD_BENCHMARKS=OFF -DQUOTA_BUILD_EXAMPLES=OFF -DQUOTA_INSTALL=OFF \
          -DQUOTA_BUILD_C=OFF >/dev/null  # c_api_fuzz compiles src/c itself
    targets=${QUOTA_FUZZ_TARGETS:-policy lease c_api}
    # shellcheck disable=SC2086
    cmake --build build/fuzz -j2 --target $(printf '%s_fuzz ' $targets)
    for t in $targets; do
      bin=build/fuzz/fuzz/${t}_fuzz
      [ -x "$bin" ] || { echo "== $bin was not built (c_api needs the C interface's packages)"; continue; }
      mkdir -p "build/fuzz/corpus/$t"
      echo "== $bin, ${QUOTA_FUZZ_SECONDS:-60} s"
      "$bin" -max_total_time="${QUOTA_FUZZ_SECONDS:-60}" -print_final_stats=1 \
             -artifact_prefix=build/fuzz/ "build/fuzz/corpus/$t" "fuzz/corpus/$t"
    done
    ;;
  *)
    echo "usage: bash cmake/run.sh demo|test [preset] | bench | fuzz" >&2
    exit 2
    ;;
esac
