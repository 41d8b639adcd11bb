"""examples/bindings/nginx/test_nginx.py — quota.lua in real nginx workers.

Starts nginx (Debian's, with libnginx-mod-http-lua) from nginx.conf.in on a free loopback
port and asks it over real sockets:
  - in process, one worker: the budget admits exactly its burst, the 429 carries
    Retry-After and the RateLimit headers, a client's own X-Quota-* headers gain it
    nothing, no API key is 401, and /metrics counts the decisions;
  - in process, budgets start spent when a worker starts (restart safety, the default);
  - in process with two workers: nginx refuses to start, naming the reason;
  - Redis killed under a fail-closed route: 503;
  - on Redis ($QUOTA_REDIS_DIR) in the non-blocking mode (decisions from leased grants,
    never a round trip in a request), two workers share one budget: both admit, and the
    union of their admissions passes the envelope verifier (verify_log) with the lease
    engine's bound r*T + B + H*(units + low_water).
nginx is stopped by its master's pid. Environment: QUOTA_NGINX, QUOTA_C_LIBRARY,
QUOTA_NGINX_DIR (scratch), QUOTA_VERIFY_LOG, QUOTA_REDIS_DIR (optional).
"""
import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
RULES = """version: 1
routes:
  - name: read
rules:
  - name: nginx-read
    level: tenant
    plan: free
    route: read
    token_bucket: {rate: %s, burst: %d}
%s"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    """One nginx master (and its workers) on nginx.conf.in, in its own prefix."""

    def __init__(self, name, workers, store, rate, burst, opt_out=(), redis="", lease=""):
        self.prefix = os.path.join(os.environ["QUOTA_NGINX_DIR"], name)
        shutil.rmtree(self.prefix, ignore_errors=True)
        for d in ("logs", "tmp", "html"):
            os.makedirs(os.path.join(self.prefix, d))
        with open(os.path.join(self.prefix, "html", "index.html"), "w") as f:
            f.write("ok\n")
        rules = os.path.join(self.prefix, "rules.yaml")
        with open(rules, "w") as f:
            f.write(RULES % (rate, burst, "    lease: %s\n" % lease if lease else ""))
        self.port = free_port()
        with open(os.path.join(HERE, "nginx.conf.in")) as f:
            conf = f.read()
        for key, value in {"PREFIX": self.prefix, "LUA_DIR": HERE, "WORKERS": str(workers),
                           "STORE": store, "RULES": rules, "REDIS": redis,
                           "MODE": "non-blocking" if lease else "blocking",
                           "LISTEN": "127.0.0.1:%d" % self.port,
                           "OPT_OUT": ", ".join('"%s"' % o for o in opt_out)}.items():
            conf = conf.replace("@%s@" % key, value)
        self.conf = os.path.join(self.prefix, "nginx.conf")
        with open(self.conf, "w") as f:
            f.write(conf)
        self.process = subprocess.Popen(
            [os.environ["QUOTA_NGINX"], "-p", self.prefix, "-c", self.conf],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait_ready(self):
        for _ in range(200):  # 10 s
            if self.process.poll() is not None:
                raise AssertionError("nginx exited: " + self.process.stderr.read())
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise AssertionError("nginx did not listen on %d" % self.port)

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)  # graceful: the logs are flushed
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process.stdout.close()
        self.process.stderr.close()

    def get(self, path="/", headers=None, connection=None):
        c = connection or http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        c.request("GET", path, headers=headers or {})
        r = c.getresponse()
        body = r.read().decode()
        if connection is None:
            c.close()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, body

    def log(self, name):
        with open(os.path.join(self.prefix, "logs", name)) as f:
            return f.read()


class CdefMatchesTheHeader(unittest.TestCase):
    def test_every_struct_has_the_header_layout(self):
        # quota.lua's ffi.cdef is C: compiled beside quota/c/quota.h, each struct's size
        # and each field's offset must agree.
        cc = shutil.which("cc")
        if cc is None:
            self.skipTest("no C compiler")
        with open(os.path.join(HERE, "quota.lua")) as f:
            cdef = re.search(r"ffi\.cdef \[\[(.*?)\]\]", f.read(), re.S).group(1)
        structs = {}
        for name, body in re.findall(r"typedef struct (\w+) \{(.*?)\}", cdef, re.S):
            structs[name] = re.findall(r"(\w+)(?:\[\d+\])?;", body)
        self.assertEqual(len(structs), 5)
        prints = "".join('printf("%s %%zu\\n", sizeof(%s));' % (s, s) +
                         "".join('printf("%s.%s %%zu\\n", offsetof(%s, %s));' % (s, f, s, f)
                                 for f in fields) for s, fields in structs.items())
        include = os.path.join(HERE, "..", "..", "..", "include")
        outputs = []
        with tempfile.TemporaryDirectory() as tmp:
            for head in ('#include "quota/c/quota.h"\n', cdef):
                source = os.path.join(tmp, "layout.c")
                with open(source, "w") as f:
                    f.write("#include <stddef.h>\n#include <stdint.h>\n#include <stdio.h>\n" +
                            head + "\nint main(void) {" + prints + "return 0; }\n")
                subprocess.run([cc, "-std=c99", "-I" + include, "-o", source + ".bin", source],
                               check=True)
                outputs.append(subprocess.run([source + ".bin"], check=True,
                                              capture_output=True, text=True).stdout)
        self.assertEqual(outputs[0], outputs[1])


class InProcess(unittest.TestCase):
    def test_one_worker_holds_the_budget(self):
        n = Nginx("one", 1, "memory", "1/100s", 5, opt_out=["restart_safety"]).wait_ready()
        try:
            acme = {"X-Api-Key": "acme-key"}
            for i in range(5):
                status, headers, body = n.get(headers=acme)
                self.assertEqual((status, body), (200, "ok\n"), i)
                self.assertEqual(headers["ratelimit-policy"], '"nginx-read";q=5;w=500')
                self.assertTrue(headers["ratelimit"].startswith('"nginx-read";r=%d;' % (4 - i)))
            status, headers, body = n.get(headers=acme)
            self.assertEqual(status, 429)
            self.assertEqual(headers["retry-after"], "100")
            self.assertTrue(headers["ratelimit"].startswith('"nginx-read";r=0;'))
            # What a client sends beyond its key gains it nothing: still acme's budget.
            forged = dict(acme, **{"X-Quota-Plan": "pro", "X-Quota-Tenant": "beta",
                                   "X-Quota-Cost": "0"})
            self.assertEqual(n.get(headers=forged)[0], 429)
            self.assertEqual(n.get(headers={"X-Api-Key": "beta-key"})[0], 200)
            self.assertEqual(n.get()[0], 401)
            self.assertEqual(n.get(headers={"X-Api-Key": "nobody"})[0], 401)
            status, _, metrics = n.get("/metrics")
            self.assertEqual(status, 200)
            self.assertIn('quota_decisions_total{rule="nginx-read",route="read",'
                          'level="tenant",outcome="denied"} 2', metrics)
            self.assertIn('outcome="allowed"} 6', metrics)
        finally:
            n.stop()

    def test_budgets_start_spent_by_default(self):
        n = Nginx("spent", 1, "memory", "1/100s", 5).wait_ready()
        try:
            status, headers, _ = n.get(headers={"X-Api-Key": "acme-key"})
            self.assertEqual(status, 429)
            self.assertIn("retry-after", headers)
        finally:
            n.stop()

    def test_two_workers_refused_without_a_shared_store(self):
        n = Nginx("two", 2, "memory", "1/100s", 5)
        try:
            code = n.process.wait(timeout=10)
            stderr = n.process.stderr.read()
            self.assertNotEqual(code, 0)
            self.assertIn("worker_processes 2 with an in-process store", stderr)
        finally:
            n.stop()


class StoreDown(unittest.TestCase):
    def test_503_when_redis_cannot_decide_on_a_fail_closed_route(self):
        # A redis-server of this test's own, killed by its pid while nginx runs (blocking
        # mode: every decision asks Redis; routes fail closed by default).
        port = free_port()
        redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                                  "--save", "", "--appendonly", "no"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(100):  # 5 s
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.05)
            n = Nginx("down", 1, "redis", "10/1s", 10,
                      redis="127.0.0.1:%d" % port).wait_ready()
            try:
                self.assertEqual(n.get(headers={"X-Api-Key": "acme-key"})[0], 200)
                redis.kill()
                redis.wait(timeout=10)
                status, _, body = n.get(headers={"X-Api-Key": "acme-key"})
                self.assertEqual((status, body), (503, "rate limit store unavailable\n"))
            finally:
                n.stop()
        finally:
            if redis.poll() is None:
                redis.kill()
                redis.wait(timeout=10)


@unittest.skipUnless(os.environ.get("QUOTA_REDIS_DIR"), "no redis-server ($QUOTA_REDIS_DIR)")
class OnRedis(unittest.TestCase):
    RATE, BURST, SECONDS = 20, 20, 2.5
    UNITS, LOW_WATER, WORKERS = 5, 2, 2

    def test_two_workers_share_one_budget_within_the_envelope(self):
        with open(os.path.join(os.environ["QUOTA_REDIS_DIR"], "port")) as f:
            redis = "127.0.0.1:%d" % int(f.read())
        lease = "{mode: on, units: %d, expiry: 10s, low_water: %d}" % (self.UNITS, self.LOW_WATER)
        n = Nginx("redis", self.WORKERS, "redis", "%d/1s" % self.RATE, self.BURST, redis=redis,
                  lease=lease).wait_ready()
        statuses = []
        lock = threading.Lock()

        def client(end):
            c = http.client.HTTPConnection("127.0.0.1", n.port, timeout=10)
            mine = []
            for _ in range(2000):  # bounded; stops at `end`
                if time.monotonic() > end:
                    break
                try:
                    mine.append(n.get(headers={"X-Api-Key": "acme-key"}, connection=c)[0])
                except (http.client.HTTPException, OSError):
                    c.close()
                    c = http.client.HTTPConnection("127.0.0.1", n.port, timeout=10)
            c.close()
            with lock:
                statuses.extend(mine)

        end = time.monotonic() + self.SECONDS
        threads = [threading.Thread(target=client, args=(end,)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        n.stop()
        self.assertEqual(set(statuses) - {200, 429}, set())
        admitted = [line.split(",") for line in n.log("decisions.log").splitlines()
                    if line.split(",")[2] == "200"]
        self.assertEqual(len(admitted), statuses.count(200))
        # Both workers decided, on one budget: at least the burst, at most the envelope.
        self.assertEqual(len({pid for _, _, _, pid in admitted}), 2)
        self.assertGreaterEqual(len(admitted), self.BURST)
        held = self.WORKERS * (self.UNITS + self.LOW_WATER)  # H*(units + low_water)
        self.assertLessEqual(len(admitted), self.BURST + held + self.RATE * (self.SECONDS + 1))
        self.assertGreater(statuses.count(429), 0)
        times = sorted(int(round(float(at) * 1e6)) * 1000 for at, _, _, _ in admitted)
        csv = os.path.join(n.prefix, "admitted.csv")
        with open(csv, "w") as f:
            f.write("".join("%d,1\n" % t for t in times))
        # --extra: the units the workers may hold (the lease engine's bound), and one unit
        # for the log's millisecond times, taken in the worker as it decides.
        verdict = subprocess.run(
            [os.environ["QUOTA_VERIFY_LOG"], "token-bucket", "--rate", "%d/1s" % self.RATE,
             "--burst", str(self.BURST), "--extra", str(held + 1), csv],
            capture_output=True, text=True, timeout=60)
        self.assertEqual(verdict.returncode, 0, verdict.stdout + verdict.stderr)
        per_worker = {}
        for _, _, _, pid in admitted:
            per_worker[pid] = per_worker.get(pid, 0) + 1
        print("\n%d requests, %d admitted (per worker %s), verifier: %s" %
              (len(statuses), len(admitted), sorted(per_worker.values()), verdict.stdout.strip()))


if __name__ == "__main__":
    unittest.main()
