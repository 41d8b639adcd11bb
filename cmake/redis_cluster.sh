#!/usr/bin/env bash
# Starts and stops a throw-away Redis Cluster of 3 masters (no replicas) on loopback for
# quota's tests (CTest fixtures).
#
#   bash cmake/redis_cluster.sh start <dir>  — 3 nodes on free ports (<dir>/ports, one a
#                                              line), slots split evenly, state ok
#   bash cmake/redis_cluster.sh stop  <dir>
set -euo pipefail
what=${1:?usage: redis_cluster.sh start|stop <dir>}
dir=${2:?usage: redis_cluster.sh start|stop <dir>}
here=$(cd "$(dirname "$0")" && pwd)

case "$what" in
  start)
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd -P)
    ports=()
    for i in 1 2 3; do
      node="$dir/node$i"
      mkdir -p "$node"
      rm -f "$node/nodes.conf"
      # Each node is started like the standalone fixture, with cluster mode on.
      QUOTA_REDIS_EXTRA="--cluster-enabled yes --cluster-config-file $node/nodes.conf --cluster-node-timeout 2000" \
        bash "$here/redis_server.sh" start "$node" >/dev/null
      ports+=("$(cat "$node/port")")
    done
    printf '%s\n' "${ports[@]}" > "$dir/ports"
    redis-cli --cluster create "127.0.0.1:${ports[0]}" "127.0.0.1:${ports[1]}" \
      "127.0.0.1:${ports[2]}" --cluster-replicas 0 --cluster-yes >"$dir/create.log" 2>&1
    for _ in $(seq 1 100); do
      ok=1
      for p in "${ports[@]}"; do
        redis-cli -p "$p" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || ok=0
      done
      if [ $ok -eq 1 ]; then
        echo "redis cluster on 127.0.0.1:${ports[*]}"
        exit 0
      fi
      sleep 0.1
    done
    echo "cluster did not reach state ok; see $dir/create.log" >&2
    exit 1
    ;;
  stop)
    [ -d "$dir" ] || exit 0
    for i in 1 2 3; do bash "$here/redis_server.sh" stop "$dir/node$i" || true; done
    ;;
  *)
    echo "usage: redis_cluster.sh start|stop <dir>" >&2
    exit 2
    ;;
esac
