"""examples/bindings/nginx/bench_nginx.py — what quota.lua costs nginx, with Debian's wrk.

nginx serves a static 200 (html/index.html) from nginx.conf.in, three ways:
  static       without the access_by_lua block (no module call at all)
  in-process   every request decided by quota.lua on an in-process store (1 worker only:
               more is refused, see quota.check_workers)
  redis        every request decided by quota.lua on Redis in the non-blocking mode
               (grants of 100,000 units, renewed by the library's thread)
The budget is far above the load, so every request is admitted: the difference is the
decision's cost. Each (workers, way) is measured `--rounds` times, alternating, and the
median requests/s printed with the loss against static at the same worker count.

  QUOTA_C_LIBRARY=build/release/src/c/libquota_c.so QUOTA_NGINX_DIR=/tmp/bench \\
  QUOTA_REDIS_PORT=6379 python3 examples/bindings/nginx/bench_nginx.py --seconds 5
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_nginx  # noqa: E402  (the Nginx fixture)

ACCESS = re.compile(r"      access_by_lua_block \{.*?\n      \}\n", re.S)


def measure(n, seconds, connections, warm=False):
    out = subprocess.run(
        ["taskset", "-c", "0", "wrk", "-t", "1", "-c", str(connections), "-d", "%ds" % seconds,
         "-H", "X-Api-Key: acme-key", "http://127.0.0.1:%d/" % n.port],
        capture_output=True, text=True, check=True, timeout=seconds + 30).stdout
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if non2xx and not warm:  # warming, a key's first requests wait for its grant
        raise SystemExit("bench: %s answers were not 200:\n%s" % (non2xx.group(1), out))
    return float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))


def start(way, workers):
    redis = "127.0.0.1:%s" % os.environ.get("QUOTA_REDIS_PORT", "6379")
    if way in ("redis", "static"):  # static: the same configuration, the call removed below
        n = test_nginx.Nginx("bench-%s-%d" % (way, workers), workers, "redis", "1000000000/1s",
                             1000000000, redis=redis,
                             lease="{mode: on, units: 100000, expiry: 60s, low_water: 50000}")
    else:
        n = test_nginx.Nginx("bench-%s-%d" % (way, workers), workers, "memory", "1000000000/1s",
                             1000000000, opt_out=["restart_safety"])
    if way == "static":
        n.stop()  # rewrite the configuration without the module's call, then start again
        with open(n.conf) as f:
            conf = f.read()
        conf, count = ACCESS.subn("", conf)
        assert count == 1, "the access_by_lua block was not found"
        with open(n.conf, "w") as f:
            f.write(conf)
        n.process = subprocess.Popen([os.environ["QUOTA_NGINX"], "-p", n.prefix, "-c", n.conf],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return n.wait_ready()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--connections", type=int, default=32)
    a = p.parse_args()
    os.environ.setdefault("QUOTA_NGINX", "/usr/sbin/nginx")
    plans = [(1, "static"), (1, "in-process"), (1, "redis"), (2, "static"), (2, "redis")]
    results = {plan: [] for plan in plans}
    for _ in range(a.rounds):
        for workers, way in plans:
            n = start(way, workers)
            try:
                measure(n, 1, a.connections, warm=True)  # grants taken, connections open
                results[(workers, way)].append(measure(n, a.seconds, a.connections))
            finally:
                n.stop()
    print("| workers | way | requests/s (median of %d) | lost to rate limiting |" % a.rounds)
    print("|---|---|---|---|")
    for workers, way in plans:
        median = statistics.median(results[(workers, way)])
        base = statistics.median(results[(workers, "static")])
        lost = "—" if way == "static" else "%.1f %%" % (100.0 * (1 - median / base))
        print("| %d | %s | %s | %s |" % (workers, way, f"{median:,.0f}", lost))


if __name__ == "__main__":
    main()
