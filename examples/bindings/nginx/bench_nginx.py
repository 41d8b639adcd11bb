"""examples/bindings/nginx/bench_nginx.py — what quota.lua costs nginx, with Debian's wrk.

nginx serves a static 200 (html/index.html) from nginx.conf.in, three ways:
  static       without the access_by_lua block (no module call at all)
  in-process   every request decided by quota.lua on an in-process store (1 worker only:
               more is refused, see quota.check_workers)
  redis        every request decided by quota.lua on Redis in the non-blocking mode
               (grants of 100,000 units, renewed by the library's thread)
  lua-floor    (with --floor) an access_by_lua block that only calls one function of the
               library through the FFI: what any Lua module costs, before it decides
The module's block is the one a deployment writes (DECIDE below), without the test
configuration's time stamp for the verifier. The budget is far above the load, so every
request is admitted: the difference is the decision's cost. Each (workers, way) is measured `--rounds` times, alternating, and the
median requests/s printed with the loss against static at the same worker count.
With --perf the worker is sampled (perf record -e cpu-clock) while wrk runs, and the
time per request is split by where it went (the kernel, nginx, LuaJIT, the Lua module,
quota's library and the C++ and abseil libraries it uses, libc), medians of the rounds.

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
# lua-floor's block: the module loaded and one call into the library, nothing decided.
FLOOR = """      access_by_lua_block {
        if limiter == nil then return ngx.exit(503) end
        require("quota").abi_version()
      }
"""
# The module's block as a deployment writes it (quota.lua's example): the test
# configuration's also stamps each decision's time for the verifier's log.
DECIDE = """      access_by_lua_block {
        require("quota").access_vars(limiter, "read", "quota_tenant", "quota_plan")
      }
"""
# Where a worker's time goes (--perf): perf's shared objects, grouped.
PARTS = [("kernel", ("[kernel",)), ("nginx", ("nginx",)), ("LuaJIT", ("libluajit", "[JIT]")),
         ("Lua module", ("ngx_http_lua_module",)),
         ("quota", ("libquota_c", "libstdc++", "libabsl")), ("libc", ("libc.so", "[vdso]"))]


def measure(n, seconds, connections, warm=False, perf=None):
    wrk = subprocess.Popen(
        ["taskset", "-c", "0", "wrk", "-t", "1", "-c", str(connections), "-d", "%ds" % seconds,
         "-H", "X-Api-Key: acme-key", "http://127.0.0.1:%d/" % n.port],
        stdout=subprocess.PIPE, text=True)
    if perf is not None:  # the worker sampled for all but the first and last second
        worker = subprocess.run(["pgrep", "-P", str(n.process.pid)], capture_output=True,
                                text=True, check=True).stdout.split()[0]
        subprocess.run(["sleep", "1"], check=True)
        subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", "2000", "-p", worker,
                        "-o", perf, "--", "sleep", str(max(1, seconds - 2))],
                       capture_output=True, check=True)
    out = wrk.communicate(timeout=seconds + 30)[0]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if non2xx and not warm:  # warming, a key's first requests wait for its grant
        raise SystemExit("bench: %s answers were not 200:\n%s" % (non2xx.group(1), out))
    return float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))


def parts(perf, rps):
    """Microseconds per request in each of PARTS, from a perf record of the worker."""
    report = subprocess.run(["perf", "report", "-i", perf, "--no-children", "--sort", "dso",
                             "-g", "none"], capture_output=True, text=True, check=True).stdout
    out = dict.fromkeys((name for name, _ in PARTS), 0.0)
    for line in report.splitlines():
        m = re.match(r"\s+([0-9.]+)%\s+(\S+)", line)
        for name, prefixes in PARTS:
            if m and m.group(2).startswith(prefixes):
                out[name] += 1e6 / rps * float(m.group(1)) / 100
    return out


def start(way, workers):
    redis = "127.0.0.1:%s" % os.environ.get("QUOTA_REDIS_PORT", "6379")
    if way in ("redis", "static"):  # static: the same configuration, the call removed below
        n = test_nginx.Nginx("bench-%s-%d" % (way, workers), workers, "redis", "1000000000/1s",
                             1000000000, redis=redis,
                             lease="{mode: on, units: 100000, expiry: 60s, low_water: 50000}")
    else:
        n = test_nginx.Nginx("bench-%s-%d" % (way, workers), workers, "memory", "1000000000/1s",
                             1000000000, opt_out=["restart_safety"])
    n.stop()  # rewrite the access block (see above), then start again
    with open(n.conf) as f:
        conf = f.read()
    conf, count = ACCESS.subn({"static": "", "lua-floor": FLOOR}.get(way, DECIDE), conf)
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
    p.add_argument("--floor", action="store_true", help="add lua-floor (1 worker)")
    p.add_argument("--perf", action="store_true", help="split each request's time (perf)")
    a = p.parse_args()
    os.environ.setdefault("QUOTA_NGINX", "/usr/sbin/nginx")
    plans = [(1, "static")] + ([(1, "lua-floor")] if a.floor else []) + [
        (1, "in-process"), (1, "redis"), (2, "static"), (2, "redis")]
    results = {plan: [] for plan in plans}
    split = {plan: [] for plan in plans}
    perf = os.path.join(os.environ["QUOTA_NGINX_DIR"], "perf.data") if a.perf else None
    for _ in range(a.rounds):
        for workers, way in plans:
            n = start(way, workers)
            try:
                measure(n, 1, a.connections, warm=True)  # grants taken, connections open
                sampled = perf if workers == 1 else None
                rps = measure(n, a.seconds, a.connections, perf=sampled)
                results[(workers, way)].append(rps)
                if sampled:
                    split[(workers, way)].append(parts(perf, rps))
            finally:
                n.stop()
    print("| workers | way | requests/s (median of %d) | lost to rate limiting |" % a.rounds)
    print("|---|---|---|---|")
    for workers, way in plans:
        median = statistics.median(results[(workers, way)])
        base = statistics.median(results[(workers, "static")])
        lost = "—" if way == "static" else "%.1f %%" % (100.0 * (1 - median / base))
        print("| %d | %s | %s | %s |" % (workers, way, f"{median:,.0f}", lost))
    if not a.perf:
        return
    print("\n| 1 worker, µs per request | " + " | ".join(name for name, _ in PARTS) + " |")
    print("|---|" + "---|" * len(PARTS))
    for workers, way in plans:
        if split[(workers, way)]:
            cells = [statistics.median(s[name] for s in split[(workers, way)])
                     for name, _ in PARTS]
            print("| %s | %s |" % (way, " | ".join("%.1f" % c for c in cells)))


if __name__ == "__main__":
    main()
