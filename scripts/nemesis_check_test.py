#!/usr/bin/env python3
"""Unit tests of the nemesis checker (scripts/nemesis_check.py) on made-up histories: a clean
history passes, and each anomaly it claims to catch (a lost operation, a doubled one, a wake
delivered twice, a deadline fired 0 or 2 times, a false "nothing was written", an operation
never acknowledged) is caught in the phase it happened in, and only there.
Run: python3 scripts/nemesis_check_test.py"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nemesis_check as nc  # noqa: E402

PHASES = [
    {"name": "member-kill", "start": 10.0, "heal": 20.0, "end": 30.0},
    {"name": "bridge", "start": 30.0, "heal": 40.0, "end": 50.0},
]
WP = "wp_000000000001"
ONE = "wp_000000000002"
DL = "wp_000000000003"


def signal(key, t, result="accepted", code=202, wp=WP, done=None):
    return {"kind": "signal", "op": key, "host": "a", "wp": wp, "key": key, "t": t,
            "done": t + 0.1 if done is None else done, "code": code, "result": result}


def record(key, seq):
    return {"seq": seq, "source": f"http:{key}", "status": "progress"}


def wake(wp, n, kind):
    return {"wake_id": f"wk_{wp[3:]}_{n:04}", "kind": kind, "waitpoint": {"id": wp}}


class Clean:
    """A history with no anomaly: a monitor signalled in every phase, a one-shot resolved with
    one wake, a deadline fired once."""

    def __init__(self):
        self.ops = [
            {"kind": "arm", "op": "arm-1", "host": "a", "wp": WP, "type": "monitor", "t": 1.0},
            {"kind": "arm", "op": "arm-2", "host": "b", "wp": ONE, "type": "oneshot", "t": 12.0},
            {"kind": "arm", "op": "arm-3", "host": "a", "wp": DL, "type": "deadline", "t": 31.0},
        ]
        keys = []
        for i, t in enumerate([2.0, 11.0, 15.0, 19.0, 21.0, 31.0, 35.0, 39.0, 41.0]):
            k = f"k{i}"
            keys.append(k)
            self.ops.append(signal(k, t))
        self.ops.append(signal("one-a", 13.0, wp=ONE))
        self.ops.append(signal("one-b", 13.0, wp=ONE, result="closed", code=410))
        self.export = {
            WP: ({"status": "armed"}, [record(k, i + 1) for i, k in enumerate(keys)]),
            ONE: ({"status": "resolved"}, [record("one-a", 1)]),
            DL: ({"status": "expired"}, []),
        }
        self.wakes = [("b", wake(ONE, 1, "resolved")), ("a", wake(DL, 1, "deadline"))]

    def run(self, strict=False):
        return nc.check(self.ops, PHASES, self.export, self.wakes, 5.0, strict)


def anomalies(rows):
    return {(phase, col): r[col] for phase, r in rows.items() for col in nc.COLUMNS
            if col != "ops" and r[col]}


class CheckerTest(unittest.TestCase):
    def test_a_clean_history_has_no_anomaly_and_counts_each_operation_once(self):
        rows, findings = Clean().run()
        self.assertEqual(findings, [])
        self.assertEqual(anomalies(rows), {})
        self.assertEqual(rows["member-kill"]["ops"], 6)  # 4 of the monitor, 2 of the one-shot
        self.assertEqual(rows["bridge"]["ops"], 4)

    def test_an_acknowledged_operation_no_record_holds_is_lost(self):
        h = Clean()
        state, records = h.export[WP]
        h.export[WP] = (state, [r for r in records if r["source"] != "http:k2"])
        rows, findings = h.run()
        self.assertEqual(anomalies(rows), {("member-kill", "lost"): 1})
        self.assertIn("k2", findings[0])

    def test_a_queued_signal_for_a_one_shot_closed_by_another_is_late_but_on_a_monitor_lost(self):
        h = Clean()
        h.ops.append(signal("one-late", 13.5, wp=ONE, result="queued"))
        rows, findings = h.run()
        self.assertEqual(findings, [])
        h.ops.append(signal("mon-queued", 13.5, wp=WP, result="queued"))
        rows, _ = h.run()
        self.assertEqual(anomalies(rows), {("member-kill", "lost"): 1})

    def test_an_unanswered_operation_that_no_record_holds_is_stuck_not_lost(self):
        h = Clean()
        h.ops.append(signal("k-never", 16.0, result=None, code=0))
        h.ops.append(signal("k-never", 17.0, result="unavailable", code=503))
        rows, _ = h.run()
        self.assertEqual(anomalies(rows), {("member-kill", "stuck"): 1})

    def test_an_operation_recorded_twice_is_doubled_even_on_two_waitpoints(self):
        h = Clean()
        state, records = h.export[ONE]
        h.export[ONE] = (state, records + [record("k6", 2)])
        rows, findings = h.run()
        self.assertEqual(anomalies(rows), {("bridge", "doubled"): 1})
        self.assertIn("k6 recorded 2 times", findings[0])

    def test_a_wake_delivered_twice_is_a_duplicate_wake(self):
        h = Clean()
        h.wakes.append(("b", wake(ONE, 1, "resolved")))
        rows, _ = h.run()
        self.assertEqual(anomalies(rows), {("member-kill", "dup_wakes"): 1})

    def test_a_one_shot_that_woke_its_session_twice_is_a_duplicate_wake(self):
        h = Clean()
        h.wakes.append(("b", wake(ONE, 2, "resolved")))
        rows, _ = h.run()
        self.assertEqual(anomalies(rows), {("member-kill", "dup_wakes"): 1})

    def test_a_deadline_that_never_fired_is_counted(self):
        for status, wakes in [("armed", []), ("expired", [])]:
            h = Clean()
            h.export[DL] = ({"status": status}, [])
            h.wakes = [w for w in h.wakes if w[1]["kind"] != "deadline"] + wakes
            rows, _ = h.run()
            self.assertEqual(anomalies(rows), {("bridge", "deadline_0"): 1}, status)

    def test_a_deadline_that_fired_twice_is_counted(self):
        h = Clean()
        h.wakes.append(("a", wake(DL, 2, "deadline")))
        rows, _ = h.run()
        self.assertEqual(anomalies(rows), {("bridge", "deadline_2"): 1})

    def test_a_503_followed_by_a_duplicate_is_a_false_nothing_was_written(self):
        h = Clean()
        h.ops.append(signal("k-503", 22.0, result="unavailable", code=503))
        h.ops.append(signal("k-503", 28.0, result="duplicate"))
        h.export[WP][1].append(record("k-503", 99))
        rows, findings = h.run()
        self.assertEqual(anomalies(rows), {("member-kill", "false_unwritten"): 1})
        self.assertIn("k-503", findings[0])

    def test_a_503_then_an_ambiguous_answer_then_a_duplicate_is_not_called_false(self):
        h = Clean()
        h.ops.append(signal("k-503", 22.0, result="unavailable", code=503))
        h.ops.append(signal("k-503", 24.0, result=None, code=0))
        h.ops.append(signal("k-503", 28.0, result="duplicate"))
        h.export[WP][1].append(record("k-503", 99))
        rows, _ = h.run()
        self.assertEqual(anomalies(rows), {})

    def test_an_armed_waitpoint_the_cluster_lacks_is_lost(self):
        h = Clean()
        del h.export[DL]
        h.wakes = [w for w in h.wakes if w[1]["kind"] != "deadline"]
        rows, _ = h.run()
        self.assertEqual(anomalies(rows), {("bridge", "lost"): 1})

    def test_the_stall_under_a_fault_and_the_time_to_recover_after_its_heal(self):
        rows, findings = Clean().run(strict=True)
        # member-kill: acknowledgements at 11.1, 13.1, 15.1, 19.1 inside 10..20; bridge's at
        # 31.1, 35.1, 39.1 inside 30..40: the longest gaps are 4.0 s.
        self.assertEqual(rows["member-kill"]["stall"], 4.0)
        self.assertEqual(rows["member-kill"]["recover"], 1.1)
        self.assertEqual(rows["bridge"]["recover"], 1.1)
        self.assertEqual(findings, [])
        h = Clean()
        h.ops = [o for o in h.ops if not (o.get("kind") == "signal" and 12 < o["t"] < 20)]
        h.export[WP] = ({"status": "armed"},
                        [record(k, i) for i, k in enumerate(["k0", "k1", "k4", "k5", "k6",
                                                             "k7", "k8"])])
        h.export[ONE] = ({"status": "armed"}, [])
        rows, findings = h.run(strict=True)
        self.assertEqual(rows["member-kill"]["stall"], 8.9)
        self.assertTrue(any("slow: no progress for 8.9 s" in f for f in findings), findings)
        # A fault under which nothing can progress (a lost quorum) has no stall target.
        phases = [dict(PHASES[0], stall_target=False), PHASES[1]]
        _, findings = nc.check(h.ops, phases, h.export, h.wakes, 5.0, True)
        self.assertFalse(any("slow: no progress" in f for f in findings), findings)

    def test_after_a_lost_quorum_the_takeover_counts_from_the_cluster_regaining_a_leader(self):
        h = Clean()
        # member-kill's heal at 20; the first acknowledgement after it is at 21.1.
        phases = [dict(PHASES[0], stall_target=False, leader_at=20.5), PHASES[1]]
        rows, findings = nc.check(h.ops, phases, h.export, h.wakes, 5.0, True)
        self.assertEqual(rows["member-kill"]["after_leader"], 0.6)
        self.assertNotIn("after_leader", rows["bridge"])
        self.assertEqual(findings, [])
        # The first signal after the heal applied at 23.1 instead: 2.6 s after the leader
        # returned, too slow.
        for o in h.ops:
            if o.get("kind") == "signal" and o["t"] == 21.0:
                o["t"], o["done"] = 23.0, 23.1
        rows, findings = nc.check(h.ops, phases, h.export, h.wakes, 5.0, True)
        self.assertEqual(rows["member-kill"]["after_leader"], 2.6)
        self.assertTrue(any("2.6 s to progress after the cluster regained a raft leader" in f
                            for f in findings), findings)
        self.assertIn("| after leader |", nc.table(rows, ["member-kill", "bridge"]))

    def test_the_command_reads_a_run_directory_prints_the_table_and_fails_on_an_anomaly(self):
        h = Clean()
        with tempfile.TemporaryDirectory() as run:
            def write(rel, text):
                path = os.path.join(run, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(text)
            write("ops.jsonl", "".join(json.dumps(o) + "\n" for o in h.ops) + '{"torn')
            write("phases.jsonl", "".join(json.dumps(p) + "\n" for p in PHASES))
            for wp, (state, records) in h.export.items():
                write(f"export/waitpoints/{wp}/waitpoint.json", json.dumps(state))
                write(f"export/waitpoints/{wp}/signals.jsonl",
                      "".join(json.dumps(r) + "\n" for r in records))
            for i, (host, w) in enumerate(h.wakes):
                write(f"inbox/{host}/s/wakes/new/{i}.json", json.dumps(w))
            script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nemesis_check.py")
            ok = subprocess.run([sys.executable, script, run], capture_output=True, text=True)
            self.assertEqual(ok.returncode, 0, ok.stdout + ok.stderr)
            self.assertIn("| member-kill | 6 | 0 |", ok.stdout)
            self.assertTrue(os.path.exists(os.path.join(run, "table.md")))
            # The same wake delivered again, to another host's inbox.
            write("inbox/a/s/wakes/new/again.json", json.dumps(h.wakes[0][1]))
            bad = subprocess.run([sys.executable, script, run], capture_output=True, text=True)
            self.assertEqual(bad.returncode, 1, bad.stdout)
            self.assertIn("ANOMALY member-kill: dup_wakes", bad.stdout)


if __name__ == "__main__":
    unittest.main()
