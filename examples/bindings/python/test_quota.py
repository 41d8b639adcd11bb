"""test_quota.py - quota.py over libquota_c (QUOTA_C_LIBRARY), mirroring tests/c/c_api_test.c:
decisions and their HTTP answers, costs, estimates settled once, attempts replayed, reloads
whole or not at all, Prometheus text, rule files, an unreachable store, a closed limiter,
bad input, threads on one budget, and the structs' layout against the C header."""
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest

import quota

# tests/c/rules.yaml: the rules of every test of the C interface.
RULES = pathlib.Path(os.environ.get(
    "QUOTA_C_TEST_RULES",
    pathlib.Path(__file__).resolve().parents[3] / "tests/c/rules.yaml")).read_text()
BAD_RULES = ("version: 3\nroutes:\n  - name: read\nrules:\n  - name: x\n    level: tenant\n"
             "    plan: free\n    route: read\n    token_bucket: {rate: 1/s, burst: -4}\n")
SECOND = 100 * 10**9  # one unit per 100 s, in ns


def fresh():
    """A limiter whose budgets start full: exact counts from time 0."""
    return quota.Limiter(rules_text=RULES, opt_out={"restart_safety"})


class LimiterTest(unittest.TestCase):
    def assertCode(self, code, call, *args, **kwargs):
        with self.assertRaises(quota.QuotaError) as cm:
            call(*args, **kwargs)
        self.assertEqual(cm.exception.name, quota._lib.quota_code_name(code).decode())
        self.assertEqual(cm.exception.code, code)
        return cm.exception

    def test_decide_until_denied(self):
        with fresh() as limiter:
            for left in (2, 1, 0):
                d = limiter.decide("acme", "free", "read", now_ns=0, http=True)
                self.assertEqual((d.allowed, d.reason, d.remaining), (True, "allowed", left))
                self.assertEqual((d.http_status, d.retry_after_s), (200, None))
            self.assertEqual((d.rule, d.rule_version, d.ticket, d.replayed),
                             ("free-read", 1, 0, False))
            self.assertEqual(d.ratelimit_policy, '"free-read";q=3;w=300')
            self.assertTrue(d.ratelimit.startswith('"free-read";r=0'), d.ratelimit)
            d = limiter.decide("acme", "free", "read", now_ns=0, http=True)
            self.assertEqual((d.allowed, d.reason, d.remaining), (False, "over_limit", 0))
            self.assertEqual(d.retry_after_ns, SECOND)
            self.assertEqual((d.http_status, d.retry_after_s), (429, 100))
            # Another tenant has its own budget; without http=True no answer is made.
            d = limiter.decide("other", "free", "read", now_ns=0)
            self.assertEqual((d.allowed, d.http_status, d.ratelimit), (True, 0, ""))
            # 100 s later one unit is back.
            d = limiter.decide("acme", "free", "read", now_ns=SECOND)
            self.assertEqual((d.allowed, d.remaining), (True, 0))

    def test_cost(self):
        with fresh() as limiter:
            d = limiter.decide("acme", "free", "chat", cost=40, now_ns=0)
            self.assertEqual((d.allowed, d.remaining), (True, 60))
            d = limiter.decide("acme", "free", "chat", cost=61, now_ns=0)
            self.assertEqual((d.allowed, d.reason, d.remaining), (False, "over_limit", 60))
            # More than the burst can never pass: no retry time, no Retry-After, a 400.
            d = limiter.decide("acme", "free", "chat", cost=101, now_ns=0, http=True)
            self.assertEqual((d.allowed, d.reason, d.retry_after_ns),
                             (False, "cost_exceeds_burst", None))
            self.assertEqual((d.http_status, d.retry_after_s), (400, None))

    def test_estimate_and_settle(self):
        with fresh() as limiter:
            d = limiter.decide("acme", "free", "chat", estimate=30, now_ns=0)
            self.assertEqual((d.allowed, d.remaining), (True, 70))
            self.assertNotEqual(d.ticket, 0)
            e = self.assertCode(quota.NOT_FOUND, limiter.settle, "other", d.ticket, 12)
            self.assertIn("no such ticket of tenant", e.message)  # another's: nothing settled
            s = limiter.settle("acme", d.ticket, 12, now_ns=0)
            self.assertEqual(s, quota.Settlement(estimate=30, actual=12, surplus=18, deficit=0))
            with self.assertRaises(quota.QuotaError):  # settled once
                limiter.settle("acme", d.ticket, 12, now_ns=0)
            d = limiter.decide("acme", "free", "chat", now_ns=0)
            self.assertEqual(d.remaining, 87)  # 100 - 12 - 1
            self.assertCode(quota.NOT_FOUND, limiter.settle, "acme", 987654321, 1, now_ns=0)
            self.assertCode(quota.INVALID_ARGUMENT, limiter.settle, "acme", 987654321, -1)

    def test_attempt_replayed(self):
        with fresh() as limiter:
            d = limiter.decide("acme", "free", "read", attempt_id="req-1", now_ns=0)
            self.assertEqual((d.allowed, d.remaining, d.replayed), (True, 2, False))
            d = limiter.decide("acme", "free", "read", attempt_id="req-1", now_ns=0)
            self.assertEqual((d.allowed, d.remaining, d.replayed), (True, 2, True))
            d = limiter.decide("acme", "free", "read", attempt_id="req-2", now_ns=0)
            self.assertEqual((d.remaining, d.replayed), (1, False))

    def test_reload(self):
        with fresh() as limiter:
            d = limiter.decide("acme", "free", "read", now_ns=0)
            self.assertEqual((d.remaining, d.rule_version), (2, 1))
            v2 = RULES.replace("version: 1", "version: 2").replace("burst: 3}", "burst: 5}")
            self.assertEqual(limiter.reload(text=v2), 2)
            d = limiter.decide("acme", "free", "read", now_ns=0)
            self.assertEqual((d.allowed, d.rule_version, d.remaining), (True, 2, 1))
            # A bad set is refused whole, naming line and column; v2 stays in force.
            e = self.assertCode(quota.INVALID_ARGUMENT, limiter.reload, text=BAD_RULES)
            self.assertRegex(e.message, r"\brules:9:\d+:")
            self.assertIn("burst", e.message)
            self.assertCode(quota.FAILED_PRECONDITION, limiter.reload, text=RULES)
            self.assertCode(quota.INVALID_ARGUMENT, limiter.reload)
            self.assertCode(quota.INVALID_ARGUMENT, limiter.reload, path="/x", text=RULES)
            self.assertEqual(limiter.decide("acme", "free", "read", now_ns=0).rule_version, 2)
            with tempfile.TemporaryDirectory() as tmp:
                path = pathlib.Path(tmp, "rules.yaml")
                path.write_text(RULES.replace("version: 1", "version: 7"))
                self.assertEqual(limiter.reload(path=str(path)), 7)
            self.assertEqual(limiter.decide("acme", "free", "read", now_ns=0).rule_version, 7)

    def test_metrics(self):
        with fresh() as limiter:
            limiter.decide("acme", "free", "read", now_ns=0)
            text = limiter.metrics()
            self.assertIn('quota_decisions_total{rule="free-read",route="read",level="tenant",'
                          'outcome="allowed"} 1\n', text)
            guess, quota._METRICS_GUESS = quota._METRICS_GUESS, 8  # the buffer must grow
            try:
                self.assertEqual(limiter.metrics(), text)
            finally:
                quota._METRICS_GUESS = guess

    def test_rule_files(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = pathlib.Path(tmp, "rules.yaml")
            path.write_text(RULES)
            quota.Limiter(rules_path=str(path)).close()
            path.write_text("version: 1\nroutes:\n  - name: read\nrules:\n  - name: x\n"
                            "    levle: tenant\n")
            e = self.assertCode(quota.INVALID_ARGUMENT, quota.Limiter, rules_path=str(path))
            self.assertIn(f"{path}:6:", e.message)
            path.unlink()
            self.assertCode(quota.NOT_FOUND, quota.Limiter, rules_path=str(path))
        self.assertCode(quota.INVALID_ARGUMENT, quota.Limiter)  # neither path nor text
        self.assertCode(quota.INVALID_ARGUMENT, quota.Limiter, rules_path="/x", rules_text=RULES)

    def test_unreachable_store(self):
        e = self.assertCode(quota.UNAVAILABLE, quota.Limiter, rules_text=RULES, store="redis",
                            redis_addresses="127.0.0.1:1")
        self.assertIn("cannot decide", e.message)
        e = self.assertCode(quota.INVALID_ARGUMENT, quota.Limiter, rules_text=RULES,
                            store="redis", redis_addresses="127.0.0.1")
        self.assertIn("redis_addresses", e.message)

    def test_durability_options_reach_the_library(self):
        # ABI 2's fields pass through: WAIT asked of an in-process store is refused by name.
        e = self.assertCode(quota.INVALID_ARGUMENT, quota.Limiter, rules_text=RULES,
                            redis_replicas=1)
        self.assertIn("redis_replicas: 1, but the store is in process", e.message)
        e = self.assertCode(quota.INVALID_ARGUMENT, quota.Limiter, rules_text=RULES,
                            store="redis", redis_addresses="127.0.0.1:1", redis_coalesce=5000)
        self.assertIn("coalesce=5000, must be in [0, 4096]", e.message)

    def test_options_checked(self):
        with self.assertRaises(ValueError):
            quota.Limiter(rules_text=RULES, store="disk")
        with self.assertRaises(ValueError):
            quota.Limiter(rules_text=RULES, opt_out={"restart-safety"})

    def test_restart_safety_default(self):
        # Safe by default: a limiter opened now starts with its budgets spent.
        with quota.Limiter(rules_text=RULES) as limiter:
            d = limiter.decide("acme", "free", "read")
            self.assertEqual((d.allowed, d.reason), (False, "over_limit"))

    def test_closed(self):
        limiter = fresh()
        d = limiter.decide("acme", "free", "chat", estimate=5, now_ns=0)
        limiter.close()
        e = self.assertCode(quota.BAD_HANDLE, limiter.decide, "acme", "free", "read", now_ns=0)
        self.assertIn("not open", e.message)
        self.assertCode(quota.BAD_HANDLE, limiter.settle, "acme", d.ticket, 1)
        self.assertCode(quota.BAD_HANDLE, limiter.reload, text=RULES)
        self.assertCode(quota.BAD_HANDLE, limiter.metrics)
        limiter.close()  # closed once: a second close does nothing

    def test_bad_requests(self):
        with fresh() as limiter:
            e = self.assertCode(quota.INVALID_ARGUMENT, limiter.decide, "acme", "free", "write")
            self.assertIn("write", e.message)
            e = self.assertCode(quota.INVALID_ARGUMENT, limiter.decide, "acme", "free", "chat",
                                cost=0)
            self.assertIn("cost: 0", e.message)
            self.assertCode(quota.INVALID_ARGUMENT, limiter.decide, "acme", "free", "chat",
                            cost=-5)
            self.assertCode(quota.INVALID_ARGUMENT, limiter.decide, "acme", "free", "chat",
                            estimate=0)
            self.assertCode(quota.INVALID_ARGUMENT, limiter.decide, "acme", "free", "chat",
                            cost=1, estimate=1)
            e = self.assertCode(quota.INVALID_ARGUMENT, limiter.decide, "", "free", "read")
            self.assertIn("tenant: empty", e.message)
            e = self.assertCode(quota.INVALID_ARGUMENT, limiter.decide, "ac\0me", "free", "read")
            self.assertIn("NUL byte at offset 2", e.message)
            # Bounds are in UTF-8 bytes: 65 "é" are 130 bytes, over 128.
            e = self.assertCode(quota.INVALID_ARGUMENT, limiter.decide, "é" * 65, "free", "read")
            self.assertIn("130 bytes", e.message)
            e = self.assertCode(quota.INVALID_ARGUMENT, limiter.decide, "é", "free", "read")
            self.assertIn("byte 0xc3", e.message)  # ids are ASCII: [A-Za-z0-9._@-]
            self.assertTrue(limiter.decide("a" * 128, "free", "read", now_ns=0).allowed)
            # Nothing above was deducted: the whole burst is still there.
            d = limiter.decide("acme", "free", "read", now_ns=0)
            self.assertEqual((d.allowed, d.remaining), (True, 2))

    def test_threads_share_one_budget(self):
        # 4 threads, 6,000 calls on a burst of 4,000 at one time: exactly 4,000 admitted.
        with fresh() as limiter:
            admitted, start = [0] * 4, threading.Barrier(4)

            def work(i):
                start.wait()
                for _ in range(1500):
                    admitted[i] += limiter.decide("acme", "pro", "read", now_ns=0).allowed

            threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(sum(admitted), 4000)

    def test_close_while_deciding(self):
        # Every call is a decision or BAD_HANDLE; nothing else, nothing crashes.
        limiter, other, start = fresh(), [], threading.Barrier(5)

        def work():
            start.wait()
            for _ in range(1000):
                try:
                    limiter.decide("acme", "pro", "read", now_ns=0)
                except quota.QuotaError as e:
                    if e.code != quota.BAD_HANDLE:
                        other.append(e)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        start.wait()
        limiter.close()
        for t in threads:
            t.join()
        self.assertEqual(other, [])
        self.assertCode(quota.BAD_HANDLE, limiter.metrics)


class LibraryTest(unittest.TestCase):
    def test_missing_library_is_a_clear_import_error(self):
        env = dict(os.environ, QUOTA_C_LIBRARY="/nonexistent/libquota_c.so")
        run = subprocess.run([sys.executable, "-c", "import quota"], env=env, text=True,
                             capture_output=True, cwd=os.path.dirname(__file__) or ".")
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("ImportError: quota: cannot load the C interface from "
                      "/nonexistent/libquota_c.so", run.stderr)

    def test_code_names(self):
        self.assertEqual(quota.QuotaError(quota.BAD_HANDLE, "m").name, "QUOTA_BAD_HANDLE")
        self.assertEqual(quota.QuotaError(999, "m").name, "QUOTA_UNKNOWN_CODE")

    def test_structs_match_the_header(self):
        # A C program prints each struct's sizeof and its fields' offsets, as compiled.
        cc = shutil.which("cc")
        include = pathlib.Path(__file__).resolve().parents[3] / "include"
        if cc is None or not (include / "quota/c/quota.h").exists():
            self.skipTest("no C compiler or no quota/c/quota.h")
        structs = {"quota_str": quota.QuotaStr, "quota_config": quota.QuotaConfig,
                   "quota_request": quota.QuotaRequest, "quota_decision": quota.QuotaDecision,
                   "quota_settle_request": quota.QuotaSettleRequest,
                   "quota_settlement": quota.QuotaSettlement,
                   "quota_rules": quota.QuotaRules, "quota_error": quota.QuotaErrorStruct}
        lines, expected = [], []
        for c_name, py in structs.items():
            lines.append(f'printf("{c_name} %zu\\n", sizeof({c_name}));')
            expected.append(f"{c_name} {quota.ctypes.sizeof(py)}")
            for field, *_ in py._fields_:
                lines.append(f'printf("{c_name}.{field} %zu\\n", offsetof({c_name}, {field}));')
                expected.append(f"{c_name}.{field} {getattr(py, field).offset}")
        source = ("#include <stddef.h>\n#include <stdio.h>\n#include \"quota/c/quota.h\"\n"
                  "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n")
        with tempfile.TemporaryDirectory() as tmp:
            pathlib.Path(tmp, "layout.c").write_text(source)
            subprocess.run([cc, "-std=c99", f"-I{include}", "-o", f"{tmp}/layout",
                            f"{tmp}/layout.c"], check=True)
            out = subprocess.run([f"{tmp}/layout"], check=True, capture_output=True, text=True)
        self.assertEqual(out.stdout.splitlines(), expected)


if __name__ == "__main__":
    unittest.main()
