#!/usr/bin/env python3
"""One host's workload under scripts/nemesis, run inside that host's network namespace.

Every operation carries a unique id and every attempt is appended to RUN/ops-HOST.jsonl (the
format scripts/nemesis_check.py reads) as it completes:
- a monitor armed here, signalled `progress` every 0.25 s through this host's HTTP shim;
- a one-shot armed here every 4 s and published in RUN/oneshots/, which the workload of every
  host signals `ok` once, so each one-shot is signalled from both hosts at about once;
- a waitpoint with a 3.6 s deadline armed every 3 s and never signalled;
- the wakes this host's inboxes receive, each logged when first seen.
A signal is retried under its Idempotency-Key (its operation id) until the cluster
acknowledges it (202) or says its waitpoint closed (410): 0.5 s after a refusal or no answer,
whatever Retry-After says, so the log shows when service came back to within a second. New
operations stop when RUN/stop appears; one in flight keeps trying for 30 s more.
"""

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

RUN, HOST, HOME, BIN = sys.argv[1:5]
PORT = int(os.environ.get("NEMESIS_PORT", "3001"))
LOG = open(os.path.join(RUN, f"ops-{HOST}.jsonl"), "a", buffering=1, encoding="utf-8")
LOCK = threading.Lock()
STOP = os.path.join(RUN, "stop")
ONESHOTS = os.path.join(RUN, "oneshots")


def log(entry):
    with LOCK:
        LOG.write(json.dumps(entry) + "\n")


def stopping():
    return os.path.exists(STOP)


def given_up():
    try:
        return time.time() > os.path.getmtime(STOP) + 30
    except FileNotFoundError:
        return False


def arm(op, kind, extra):
    """`waitpoint create` on this host; the waitpoint's id and secret, or None."""
    args = [BIN, "create", "--json", "--label", op, "--intent", "nemesis",
            "--session", f"s-{HOST}"] + extra
    t = time.time()
    try:
        out = subprocess.run(args, env=dict(os.environ, CORTEX_HOME=HOME), capture_output=True,
                             timeout=20, text=True)
        reply = json.loads(out.stdout) if out.returncode == 0 else None
    except (subprocess.TimeoutExpired, json.JSONDecodeError):
        reply = None
    if not reply:
        log({"kind": "arm_failed", "op": op, "host": HOST, "type": kind, "t": t,
             "done": time.time()})
        return None
    wp, secret = reply["id"], reply["secret"]
    log({"kind": "arm", "op": op, "host": HOST, "wp": wp, "type": kind, "t": t,
         "done": time.time()})
    return wp, secret


def signal(key, wp, secret, status):
    """Sends one signal until it is acknowledged or its waitpoint closed."""
    body = json.dumps({"id": wp, "secret": secret, "status": status, "message": key}).encode()
    while True:
        t = time.time()
        req = urllib.request.Request(f"http://127.0.0.1:{PORT}/webhook/signal", data=body,
                                     headers={"Content-Type": "application/json",
                                              "Idempotency-Key": key})
        code, result = 0, None
        try:
            with urllib.request.urlopen(req, timeout=8) as r:
                code, result = r.status, json.loads(r.read()).get("result")
        except urllib.error.HTTPError as e:
            code = e.code
            try:
                result = json.loads(e.read()).get("result")
            except (ValueError, OSError):
                result = None
        except (OSError, ValueError):
            pass
        log({"kind": "signal", "op": key, "host": HOST, "wp": wp, "key": key, "t": t,
             "done": time.time(), "code": code, "result": result})
        if code in (202, 410) or given_up():
            return
        time.sleep(0.5)


def monitor():
    got = None
    while got is None and not stopping():
        got = arm(f"{HOST}-monitor", "monitor", ["--max-signals", "10000"])
    n = 0
    while got and not stopping():
        n += 1
        signal(f"nm-{HOST}-m-{n}", got[0], got[1], "progress")
        time.sleep(0.25)


def oneshots():
    n = 0
    while not stopping():
        n += 1
        got = arm(f"{HOST}-oneshot-{n}", "oneshot", [])
        if got:
            tmp = os.path.join(ONESHOTS, f".{got[0]}")
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"wp": got[0], "secret": got[1]}, f)
            os.rename(tmp, os.path.join(ONESHOTS, f"{got[0]}.json"))
        time.sleep(4)


def signal_oneshots():
    done = set()
    while not stopping():
        for name in sorted(os.listdir(ONESHOTS)):
            if name.startswith(".") or name in done:
                continue
            done.add(name)
            with open(os.path.join(ONESHOTS, name), encoding="utf-8") as f:
                o = json.load(f)
            threading.Thread(target=signal, daemon=True,
                             args=(f"nm-{HOST}-o-{o['wp']}", o["wp"], o["secret"], "ok")).start()
        time.sleep(0.1)


def deadlines():
    n = 0
    while not stopping():
        n += 1
        arm(f"{HOST}-deadline-{n}", "deadline", ["--expires-in-hours", "0.001"])
        time.sleep(3)


def wakes():
    seen = set()
    root = os.path.join(HOME, "sessions")
    while not given_up():
        for dirpath, _, files in os.walk(root):
            for name in files:
                if name.endswith(".json") and name not in seen:
                    seen.add(name)
                    try:
                        with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                            w = json.load(f)
                    except (OSError, ValueError):
                        seen.discard(name)
                        continue
                    log({"kind": "wake", "host": HOST, "t": time.time(),
                         "wp": (w.get("waitpoint") or {}).get("id"),
                         "wake_id": w.get("wake_id"), "wake": w.get("kind")})
        time.sleep(0.2)


os.makedirs(ONESHOTS, exist_ok=True)
workers = [threading.Thread(target=f) for f in (monitor, oneshots, signal_oneshots, deadlines)]
watcher = threading.Thread(target=wakes, daemon=True)
for w in workers + [watcher]:
    w.start()
for w in workers:
    w.join()
# Signals in flight (one-shots) keep trying until given up.
while threading.active_count() > 2 and not given_up():
    time.sleep(0.5)
