#!/usr/bin/env bash
# Starts and stops a throw-away redis-server for quota's tests (CTest fixtures).
#
#   bash cmake/redis_server.sh start   <dir>   — start on a free loopback port; the port
#                                                 goes into <dir>/port
#   bash cmake/redis_server.sh restart <dir>   — start again on the port in <dir>/port
#                                                 (fault tests, after killing it)
#   bash cmake/redis_server.sh stop    <dir>   — stop it (SIGTERM, then SIGKILL)
#
# QUOTA_REDIS_EXTRA adds redis-server arguments (cmake/redis_cluster.sh: cluster mode);
# QUOTA_REDIS_WRAPPER runs redis-server under a command (redis_instructions_bench:
# valgrind), which then gets 30 s instead of 5 to answer.
# A port is free when a server we started there answers with OUR directory: another
# server already on the port would answer with its own, and a bind failure leaves no
# process behind. No persistence (--save '', no AOF): the data lives in memory only.
set -euo pipefail
what=${1:?usage: redis_server.sh start|restart|stop <dir>}
dir=${2:?usage: redis_server.sh start|restart|stop <dir>}

launch() {  # launch <port>: 0 when our server answers on <port>
  local port=$1
  rm -f "$dir/redis.pid"
  local args=(--port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir"
    --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" --protected-mode no)
  local tries=100
  if [ -n "${QUOTA_REDIS_WRAPPER:-}" ]; then
    # In the background rather than daemonized: a tool like valgrind answers for the
    # process it started, not for a forked child.
    # shellcheck disable=SC2086
    ${QUOTA_REDIS_WRAPPER} redis-server "${args[@]}" --daemonize no \
      ${QUOTA_REDIS_EXTRA:-} </dev/null >/dev/null 2>&1 &
    tries=600
  else
    # shellcheck disable=SC2086
    redis-server "${args[@]}" --daemonize yes ${QUOTA_REDIS_EXTRA:-} >/dev/null 2>&1 ||
      return 1
  fi
  for _ in $(seq 1 "$tries"); do
    if [ -s "$dir/redis.pid" ] && ! kill -0 "$(cat "$dir/redis.pid")" 2>/dev/null; then
      return 1  # it exited: most likely the port was taken
    fi
    local answer
    answer=$(redis-cli -h 127.0.0.1 -p "$port" config get dir 2>/dev/null | tail -n 1 || true)
    if [ "$answer" = "$dir" ]; then return 0; fi
    sleep 0.05
  done
  return 1
}

stop() {
  [ -s "$dir/redis.pid" ] || return 0
  local pid
  pid=$(cat "$dir/redis.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$dir/redis.pid"; return 0; }
    sleep 0.05
  done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$dir/redis.pid"
}

case "$what" in
  start)
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd -P)
    stop
    for _ in $(seq 1 50); do
      # Below the kernel's ephemeral range (ip_local_port_range, 32768-60999 by default):
      # a client reconnecting to a killed server's port could otherwise be given that
      # very port as its source and connect to itself, keeping the restart from binding.
      port=$(( 20000 + RANDOM % 12000 ))
      if launch "$port"; then
        echo "$port" > "$dir/port"
        echo "redis-server on 127.0.0.1:$port (dir $dir)"
        exit 0
      fi
    done
    echo "could not start redis-server on any of 50 random ports; see $dir/redis.log" >&2
    exit 1
    ;;
  restart)
    dir=$(cd "$dir" && pwd -P)
    stop
    port=$(cat "$dir/port")
    for _ in $(seq 1 40); do
      launch "$port" && exit 0
      sleep 0.05
    done
    echo "could not restart redis-server on port $port" >&2
    exit 1
    ;;
  stop)
    [ -d "$dir" ] || exit 0
    dir=$(cd "$dir" && pwd -P)
    stop
    ;;
  *)
    echo "usage: redis_server.sh start|restart|stop <dir>" >&2
    exit 2
    ;;
esac
