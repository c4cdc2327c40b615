#!/usr/bin/env python3
"""The nemesis checker: reads one run's history and says, per fault, what broke.

scripts/nemesis writes a run directory; this reads it (nothing else) and prints one row per
phase, then exits 1 when any row holds an anomaly. The inputs, all in the run directory:

- ops.jsonl: the workload's history, one JSON object a line, appended as it happened:
  {"kind": "arm", "op", "host", "wp", "type": "monitor"|"oneshot"|"deadline", "t"} for a
  waitpoint armed, and {"kind": "signal", "op", "host", "wp", "key", "t", "done", "code",
  "result"} for each attempt to send a signal (its POST answered `code` with `result`; code 0:
  no answer). `key` is the signal's Idempotency-Key, unique to the operation: every attempt of
  one operation carries the same key, so the cluster counts it once whatever was answered.
- phases.jsonl: {"name", "start", "heal", "end"} per fault (times in the ops' clock),
  "stall_target": false for a fault under which nothing can progress (a lost quorum), and
  "leader_at" after a lost quorum: when the cluster first answered a linearizable read again
  (it had a raft leader with a majority).
- export/waitpoints/<wp>/{waitpoint.json,signals.jsonl}: `waitpoint export` at one revision.
- inbox/<host>/...: every wake file each host's sessions received (new/ and cur/).
- leftover.json (optional): {"in": handed-over keys left, "spooled": files left, ...}.

What counts as an anomaly (safety and honesty):
- lost: an operation the cluster acknowledged (202 accepted/duplicate/queued) that no record
  holds; a waitpoint armed (its create answered) that the export lacks. A signal only queued
  (handed over) for a one-shot another signal closed first is late, not lost.
- doubled: an operation recorded more than once (under its key, on any waitpoint).
- stuck: an operation never acknowledged by the end of the run (the client retried until then),
  or a one-shot signalled and acknowledged that is still armed.
- dup wakes: a wake id delivered more than once, or a one-shot with more than one `resolved`
  wake.
- deadline 0/2: a waitpoint armed with a short deadline and never signalled that did not end
  `expired` with exactly one `deadline` wake (0: never fired, 2: fired more than once).
- false unwritten: an operation answered 503 ("nothing was written"), whose next definite
  answer was "duplicate" with no ambiguous answer (no answer, a 500 "unknown") before: the
  503 was false, since only this client sends under that key.

And two timings per phase (not anomalies unless --strict): `stall`, the longest time from the
fault's start to its heal with no progress anywhere (no signal answered "accepted", which only
the leader answers, and no wake arriving: failover shows here), and `recover`, from the heal
to the first progress after it (a signal sent after it and accepted, or a wake); for a phase
with "leader_at", also `after leader`, from that moment to the first progress (a signal accepted
or a wake), which --strict holds to 2 s instead of `recover`.
ops.jsonl may also hold {"kind": "wake", "host", "wp", "wake_id", "t"}: a wake first seen in an
inbox; and {"kind": "arm_failed", ...}: a create that did not answer (not checked).
"""

import argparse
import json
import os
import sys
from collections import defaultdict

ACKED = {"accepted", "duplicate", "queued"}


def read_jsonl(path):
    """Every complete JSON line of `path`; a torn last line (a killed writer) is skipped."""
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        pass
    return out


def read_export(root):
    """{wp id: (state, [records])} from an export's waitpoints/."""
    out = {}
    base = os.path.join(root, "waitpoints")
    if not os.path.isdir(base):
        return out
    for wp in sorted(os.listdir(base)):
        if not wp.startswith("wp_"):
            continue
        d = os.path.join(base, wp)
        try:
            with open(os.path.join(d, "waitpoint.json"), encoding="utf-8") as f:
                state = json.load(f)
        except (OSError, json.JSONDecodeError):
            state = {}
        out[wp] = (state, read_jsonl(os.path.join(d, "signals.jsonl")))
    return out


def read_inbox(root):
    """Every wake file under root, as (host, wake)."""
    out = []
    if not os.path.isdir(root):
        return out
    for host in sorted(os.listdir(root)):
        for dirpath, _, files in os.walk(os.path.join(root, host)):
            for name in sorted(files):
                if not name.endswith(".json"):
                    continue
                try:
                    with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                        out.append((host, json.load(f)))
                except (OSError, json.JSONDecodeError):
                    continue
    return out


def key_of(source):
    """The Idempotency-Key an HTTP record's source carries (`http:<key>`), else None."""
    if isinstance(source, str) and source.startswith("http:"):
        return source[len("http:"):]
    return None


COLUMNS = ["ops", "lost", "doubled", "stuck", "dup_wakes", "deadline_0", "deadline_2",
           "false_unwritten"]


def check(ops, phases, export, wakes, lease_s=5.0, strict=False):
    """The per-phase rows and the list of findings (each a sentence naming what broke)."""
    phases = sorted(phases, key=lambda p: p["start"])

    def phase_of(t):
        name = "setup"
        for p in phases:
            if t >= p["start"]:
                name = p["name"]
        return name

    rows = {p["name"]: dict.fromkeys(COLUMNS, 0) for p in phases}
    rows.setdefault("setup", dict.fromkeys(COLUMNS, 0))
    findings = []

    def flag(phase, column, text):
        rows.setdefault(phase, dict.fromkeys(COLUMNS, 0))[column] += 1
        findings.append(f"{phase}: {column}: {text}")

    # Every record by the key it came under.
    recorded = defaultdict(list)
    for wp, (_, records) in export.items():
        for r in records:
            k = key_of(r.get("source"))
            if k is not None:
                recorded[k].append(wp)

    arms = {o["wp"]: o for o in ops if o.get("kind") == "arm" and o.get("wp")}
    attempts = defaultdict(list)
    for o in ops:
        if o.get("kind") == "signal":
            attempts[o["key"]].append(o)

    acked_wps = set()
    for key, tries in attempts.items():
        tries.sort(key=lambda o: o["t"])
        phase = phase_of(tries[0]["t"])
        rows.setdefault(phase, dict.fromkeys(COLUMNS, 0))["ops"] += 1
        results = [o.get("result") for o in tries]
        acked = any(r in ACKED for r in results)
        closed = any(r == "closed" for r in results)
        n = len(recorded.get(key, []))
        if n > 1:
            flag(phase, "doubled", f"{key} recorded {n} times ({recorded[key]})")
        wp = tries[0]["wp"]
        state, records = export.get(wp, ({}, []))
        # A signal queued (handed over) for a one-shot that another signal closed first is
        # late, not lost: the leader answers it "closed", as it would have answered here.
        late = ("accepted" not in results and "duplicate" not in results
                and arms.get(wp, {}).get("type") == "oneshot"
                and state.get("status") not in (None, "armed") and records)
        if acked and n == 0 and not late:
            flag(phase, "lost", f"{key} acknowledged ({results}) but recorded nowhere")
        if not acked and not closed:
            flag(phase, "stuck", f"{key} never acknowledged ({results})")
        if acked:
            acked_wps.add(tries[0]["wp"])
        # An honest "nothing was written" is followed by a retry that writes it (accepted,
        # queued): a duplicate there says the 503 was false, unless an answer in between
        # left the outcome open.
        said_unwritten = False
        for o in tries:
            r, code = o.get("result"), o.get("code", 0)
            if code == 503:
                said_unwritten = True
            elif r in ACKED or r == "closed":
                if said_unwritten and r == "duplicate":
                    flag(phase, "false_unwritten",
                         f"{key} was answered 503 (nothing written), then duplicate")
                break
            elif code == 0 or code >= 500:
                said_unwritten = False

    for wp, arm in arms.items():
        phase = phase_of(arm["t"])
        if wp not in export:
            flag(phase, "lost", f"{wp} ({arm['type']}) was armed but is not in the cluster")

    by_wake = defaultdict(list)
    of_wp = defaultdict(list)
    for host, w in wakes:
        wid = w.get("wake_id")
        by_wake[wid].append(host)
        of_wp[(w.get("waitpoint") or {}).get("id")].append(w)
    for wid, hosts in by_wake.items():
        if len(hosts) > 1:
            wp = "wp_" + wid[3:].rsplit("_", 1)[0] if isinstance(wid, str) else None
            arm = arms.get(wp)
            phase = phase_of(arm["t"]) if arm else "setup"
            flag(phase, "dup_wakes", f"wake {wid} delivered {len(hosts)} times (on {hosts})")

    for wp, arm in arms.items():
        if wp not in export:
            continue
        state, _ = export[wp]
        phase = phase_of(arm["t"])
        kinds = [w.get("kind") for w in of_wp.get(wp, [])]
        if arm["type"] == "deadline":
            # Distinct deadline wakes: a copy of one is a duplicate wake, counted above.
            fired = len({w.get("wake_id") for w in of_wp.get(wp, [])
                         if w.get("kind") == "deadline"})
            if state.get("status") != "expired" or fired == 0:
                flag(phase, "deadline_0",
                     f"{wp}: status {state.get('status')}, {fired} deadline wakes")
            elif fired > 1:
                flag(phase, "deadline_2", f"{wp}: {fired} deadline wakes")
        elif arm["type"] == "oneshot" and wp in acked_wps:
            resolved = len({w.get("wake_id") for w in of_wp.get(wp, [])
                            if w.get("kind") == "resolved"})
            if state.get("status") == "armed":
                flag(phase, "stuck", f"{wp}: acknowledged a signal but is still armed")
            elif resolved > 1:
                flag(phase, "dup_wakes", f"{wp}: {resolved} resolved wakes ({kinds})")
            elif resolved == 0 and state.get("status") == "resolved":
                flag(phase, "stuck", f"{wp}: resolved but its wake never reached {arm['host']}")

    # Timings: progress is a signal applied (answered "accepted", which only the leader
    # answers: a standby's "queued" goes on while no daemon leads) or a wake reaching an inbox.
    acks = sorted([(o["t"], o.get("done", o["t"])) for o in ops
                   if o.get("kind") == "signal" and o.get("result") == "accepted"]
                  + [(o["t"], o["t"]) for o in ops if o.get("kind") == "wake"])
    for p in phases:
        row = rows[p["name"]]
        done = [d for _, d in acks if p["start"] <= d <= p["heal"]]
        marks = [p["start"]] + done + [p["heal"]]
        row["stall"] = round(max(b - a for a, b in zip(marks, marks[1:])), 1)
        after = [d for t, d in acks if t >= p["heal"]]
        row["recover"] = round(min(after) - p["heal"], 1) if after else None
        if row["recover"] is None:
            findings.append(f"{p['name']}: stuck: nothing was acknowledged after the heal")
            row["stuck"] += 1
        if strict and p.get("stall_target", True) and row["stall"] > lease_s + 2:
            findings.append(f"{p['name']}: slow: no progress for {row['stall']} s under the "
                            f"fault (target: the lease, {lease_s} s, + 2 s)")
        # After a lost quorum the cluster first elects a raft leader (etcd's doing, counted in
        # `recover`); the takeover target counts from that moment (`leader_at`).
        if p.get("leader_at") is not None:
            led = [d for t, d in acks if d >= p["leader_at"]]
            row["after_leader"] = round(min(led) - p["leader_at"], 1) if led else None
        wait, since = ((row.get("after_leader"), "the cluster regained a raft leader")
                       if p.get("leader_at") is not None else (row["recover"], "the heal"))
        if strict and wait is not None and wait > 2:
            findings.append(f"{p['name']}: slow: {wait} s to progress after {since} "
                            "(target: 2 s)")
    return rows, findings


def table(rows, order):
    head = ["phase"] + COLUMNS + ["stall", "recover", "after leader"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in order:
        if name not in rows:
            continue
        r = rows[name]
        cells = [name] + [str(r.get(c, 0)) for c in COLUMNS]
        cells += [f"{r['stall']} s" if "stall" in r else "-",
                  f"{r['recover']} s" if r.get("recover") is not None else "-",
                  f"{r['after_leader']} s" if r.get("after_leader") is not None else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", help="the run directory scripts/nemesis wrote")
    ap.add_argument("--lease", type=float, default=5.0, help="the lease TTL (s)")
    ap.add_argument("--strict", action="store_true",
                    help="count a stall past the lease + 2 s or a recovery past 2 s as anomalies")
    a = ap.parse_args(argv)
    ops = read_jsonl(os.path.join(a.run, "ops.jsonl"))
    phases = read_jsonl(os.path.join(a.run, "phases.jsonl"))
    export = read_export(os.path.join(a.run, "export"))
    wakes = read_inbox(os.path.join(a.run, "inbox"))
    rows, findings = check(ops, phases, export, wakes, a.lease, a.strict)
    try:
        with open(os.path.join(a.run, "leftover.json"), encoding="utf-8") as f:
            left = json.load(f)
        for what, n in left.items():
            if n:
                findings.append(f"end: stuck: {n} {what} left in the cluster or spool")
    except (OSError, json.JSONDecodeError):
        pass
    order = ["setup"] + [p["name"] for p in sorted(phases, key=lambda p: p["start"])]
    text = table(rows, order)
    print(text)
    with open(os.path.join(a.run, "table.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    for line in findings:
        print("ANOMALY " + line)
    print(f"{sum(r['ops'] for r in rows.values())} operations, {len(export)} waitpoints, "
          f"{len(wakes)} wakes, {len(findings)} anomalies")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
