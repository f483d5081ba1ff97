"""Closed-loop HTTP load client for the genie-flow API (/v1/ai/{key}/...).

One round trip = POST event user_input (answer must be next_actions == ["poll"]), then
POST event poll every --poll-interval seconds until next_actions != ["poll"]; the final
response must equal "<Q=" + input + ">" (the invoker's result rendered by the user state).
Each client thread owns its sessions; a new session is started every --per-session round
trips (bounds dialogue growth; session creation is inside the wall clock, outside RT latency).

Round trips completing inside [t0, t0+duration] count, t0 = start + warmup.
CPU of the PIDs given with --pid NAME=PID (plus their children) is sampled at t0 and t1.
"""
import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time

CLK = os.sysconf("SC_CLK_TCK")


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def proc_cpu(pid):
    """utime+stime (s) of pid plus its live children (prefork pool)."""
    total = 0.0
    pids = [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLK
        except OSError:
            pass
    return total


def machine_cpu():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return (sum(v) - idle) / CLK, sum(v) / CLK


def redis_cpu(host, port):
    import redis
    d = redis.Redis(host=host, port=port).info("cpu")
    return float(d["used_cpu_sys"]) + float(d["used_cpu_user"])


class Stop(Exception):
    pass


class Worker(threading.Thread):
    def __init__(self, idx, args, t_end):
        super().__init__(daemon=True)
        self.idx, self.args, self.t_end = idx, args, t_end
        self.results = []  # (t_done, latency, polls)
        self.sessions = 0
        self.errors = []
        self.conn = http.client.HTTPConnection(args.host, args.port, timeout=60)

    def post(self, path, body):
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        headers.update(self.args.headers)
        self.conn.request("POST", path, body=data, headers=headers)
        r = self.conn.getresponse()
        payload = r.read()
        if r.status != 200:
            raise RTError(f"http{r.status}", (path, body.get("event"), payload[:200]))
        return json.loads(payload)

    def run(self):
        a = self.args
        base = f"/v1/ai/{a.key}"
        n = 0
        sid = None
        while time.perf_counter() < self.t_end:
            t_start = time.perf_counter()
            try:
                if sid is None or n % a.per_session == 0:
                    sid = self.post(f"{base}/start_session", {})["session_id"]
                    self.sessions += 1
                text = f"c{self.idx}-{n}"
                n += 1
                t_start = time.perf_counter()
                r = self.post(f"{base}/event", {"session_id": sid, "event": "user_input", "event_input": text})
                if r["next_actions"] != ["poll"]:
                    raise RTError("user_input_not_enqueued", r)
                polls = 0
                while True:
                    if a.poll_interval > 0:
                        time.sleep(a.poll_interval)
                    r = self.post(f"{base}/event", {"session_id": sid, "event": "poll", "event_input": ""})
                    polls += 1
                    if r["next_actions"] != ["poll"]:
                        break
                    if time.perf_counter() - t_start > a.stuck_after:
                        raise RTError("stuck_polling", r)
                t_done = time.perf_counter()
                if r.get("response") != f"<Q={text}>" or r["next_actions"] != ["user_input"]:
                    raise RTError("wrong_final_answer", r)
                self.results.append((t_done, t_done - t_start, polls))
            except RTError as e:
                # a failed round trip: record it and continue on a fresh session
                now = time.perf_counter()
                self.errors.append((now, e.kind, repr(e.detail)[:300], now - t_start))
                sid = None
                n = 0
            except Exception as e:  # noqa: transport problems
                now = time.perf_counter()
                self.errors.append((now, type(e).__name__, repr(e)[:300], now - t_start))
                sid = None
                n = 0
                self.conn.close()
                self.conn = http.client.HTTPConnection(a.host, a.port, timeout=60)


class RTError(Exception):
    def __init__(self, kind, detail):
        super().__init__(kind)
        self.kind, self.detail = kind, detail


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--key", default="perf")
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--poll-interval", type=float, default=0.005)
    ap.add_argument("--per-session", type=int, default=10)
    ap.add_argument("--stuck-after", type=float, default=3.0)
    ap.add_argument("--pid", action="append", default=[], help="NAME=PID to sample CPU for")
    ap.add_argument("--redis", default="127.0.0.1:6379")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=None)
    ap.add_argument("--header", action="append", default=[], help="NAME: VALUE sent with every request")
    a = ap.parse_args()
    a.headers = dict(h.split(": ", 1) for h in a.header)

    pids = {k: int(v) for k, v in (p.split("=", 1) for p in a.pid)}
    rhost, rport = a.redis.split(":")
    t_start = time.perf_counter()
    t0 = t_start + a.warmup
    t1 = t0 + a.duration
    workers = [Worker(i, a, t1) for i in range(a.clients)]
    for w in workers:
        w.start()
    time.sleep(max(0.0, t0 - time.perf_counter()))
    la0 = open("/proc/loadavg").read().split()[:3]
    cpu0 = {k: proc_cpu(p) for k, p in pids.items()}
    self0 = os.times()
    m0 = machine_cpu()
    r0 = redis_cpu(rhost, int(rport))
    time.sleep(max(0.0, t1 - time.perf_counter()))
    cpu1 = {k: proc_cpu(p) for k, p in pids.items()}
    self1 = os.times()
    m1 = machine_cpu()
    r1 = redis_cpu(rhost, int(rport))
    la1 = open("/proc/loadavg").read().split()[:3]
    for w in workers:
        w.join(timeout=40)

    rts = [r for w in workers for r in w.results if t0 <= r[0] <= t1]
    lat = sorted(r[1] for r in rts)
    polls = [r[2] for r in rts]
    errors = [e for w in workers for e in w.errors if t0 <= e[0] <= t1]
    err_kinds = {}
    for e in errors:
        err_kinds[e[1]] = err_kinds.get(e[1], 0) + 1
    wall = t1 - t0

    def pct(p):
        if not lat:
            return None
        k = max(0, min(len(lat) - 1, int(round(p / 100.0 * len(lat) + 0.5)) - 1))
        return lat[k]

    cpu = {k: round(cpu1[k] - cpu0[k], 2) for k in pids}
    cpu["client"] = round((self1.user + self1.system) - (self0.user + self0.system), 2)
    cpu["redis-server (whole server)"] = round(r1 - r0, 2)
    busy = m1[0] - m0[0]
    res = dict(
        label=a.label, clients=a.clients, duration_s=wall, poll_interval_s=a.poll_interval,
        per_session=a.per_session,
        round_trips=len(rts), rt_per_s=round(len(rts) / wall, 2),
        lat_median_ms=round(statistics.median(lat) * 1000, 1) if lat else None,
        lat_p95_ms=round(pct(95) * 1000, 1) if lat else None,
        lat_mean_ms=round(statistics.mean(lat) * 1000, 1) if lat else None,
        lat_max_ms=round(lat[-1] * 1000, 1) if lat else None,
        polls_per_rt=round(statistics.mean(polls), 2) if polls else None,
        sessions_started=sum(w.sessions for w in workers),
        cpu_s=cpu,
        cpu_s_genie_total=round(sum(v for k, v in cpu.items() if k in pids), 2),
        cpu_ms_per_rt_genie=round(1000 * sum(v for k, v in cpu.items() if k in pids) / len(rts), 2) if rts else None,
        machine_busy_cores=round(busy / wall, 2),
        loadavg_start=la0, loadavg_end=la1,
        n_errors=len(errors), error_kinds=err_kinds,
        error_rate=round(len(errors) / (len(errors) + len(rts)), 4) if (errors or rts) else None,
        error_samples=[e[1:3] for e in errors[:3]],
        failed_rt_time_s=round(sum(e[3] for e in errors), 2),
        stuck_after_s=a.stuck_after,
    )
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
