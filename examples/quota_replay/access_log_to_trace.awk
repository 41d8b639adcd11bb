# An access log to a quota_replay trace (docs/testing.md): lines "msec|tenant|plan|route"
# as nginx writes them with
#   log_format quota '$msec|$quota_tenant|$quota_plan|$quota_route';
# (the tenant and plan your gateway derived from the API key, never a client's header)
# become "time_ns,tenant,plan,,route". $msec is seconds with a millisecond fraction: the
# nanoseconds are built as text, exactly (awk's numbers are doubles, and printf "%d" of
# seconds × 1e9 overflows in mawk, Debian's awk).
#
#   awk -F'|' -f access_log_to_trace.awk access.log > access.csv
NF == 4 {
  n = split($1, t, ".")
  frac = (n > 1 ? t[2] : "") "000000000"
  ns = t[1] substr(frac, 1, 9)
  sub(/^0+/, "", ns)
  printf "%s,%s,%s,,%s\n", (ns == "" ? "0" : ns), $2, $3, $4
}
