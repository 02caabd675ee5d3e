# SPDX-License-Identifier: MIT
"""Checks megascope task traces, independently of the C code that wrote them.

  trace_check.py json FILE [KEY=VALUE ...]      Chrome JSON
  trace_check.py perfetto FILE [KEY=VALUE ...]  Perfetto protobuf, decoded with
                                                Perfetto's own definitions
  trace_check.py same JSON PERFETTO             both, and the same trace in both

JSON times are parsed as exact decimals (no float): every "ts" and "dur" has
three decimals (integer nanoseconds); per worker, slices are ordered and do not
overlap; every slice lies inside the recording window; every flow starts inside
its producer's slice (on the producer's track) and ends at its consumer's begin.
The Perfetto file is decoded with the generated perfetto_trace_pb2 of the
`perfetto` PyPI package (scripts/deps.sh installs it): no unknown fields, every
interned name resolved on its own sequence, incremental timestamps summed per
sequence, BEGIN/END balanced and ordered per track, every flow from a slice that
ended before its consumer began. KEY=VALUE pairs are expected counts (slices,
flows, counters, budget_dropped). Exits 77 when the perfetto package is missing.
"""
import json
import re
import sys
from decimal import Decimal


def fail(msg):
    print("trace_check: " + msg)
    sys.exit(1)


def ns(d):
    v = d * 1000
    if v != v.to_integral_value():
        fail("time %s is not a whole number of nanoseconds" % d)
    return int(v)


def check_tracks(slices, window):
    """slices: {track: [(ts, dur, name, args)]}; ordered, disjoint, in the window."""
    for tid, xs in slices.items():
        xs.sort(key=lambda x: x[0])
        for a, b in zip(xs, xs[1:]):
            if a[0] + a[1] > b[0]:
                fail("worker %s: %s [%d, %d] overlaps %s at %d" % (tid, a[2], a[0], a[0] + a[1], b[2], b[0]))
        for x in xs:
            if x[0] < 0 or x[1] < 0 or (window is not None and x[0] + x[1] > window):
                fail("worker %s: %s [%d +%d] outside the window [0, %s]" % (tid, x[2], x[0], x[1], window))


def inside(xs, t):
    """The slice of sorted xs with ts <= t < ts + dur (or t == ts), else None."""
    lo, hi = 0, len(xs)
    while lo < hi:
        m = (lo + hi) // 2
        if xs[m][0] <= t:
            lo = m + 1
        else:
            hi = m
    if lo and (xs[lo - 1][0] <= t < xs[lo - 1][0] + xs[lo - 1][1] or xs[lo - 1][0] == t):
        return xs[lo - 1]
    return None


def read_json(path):
    text = open(path).read()
    for m in re.finditer(r'"(ts|dur)":([^,}]*)', text):
        if not re.fullmatch(r"\d+\.\d{3}", m.group(2)):
            fail('"%s":%s is not an exact microsecond figure with three decimals' % (m.group(1), m.group(2)))
    d = json.loads(text, parse_float=Decimal)
    meta = d["metadata"]
    window = ns(meta["window_us"])
    slices, starts, ends, counters = {}, {}, {}, 0
    for e in d["traceEvents"]:
        ph = e["ph"]
        if ph == "X":
            slices.setdefault(e["tid"], []).append((ns(e["ts"]), ns(e["dur"]), e["name"], e["args"]))
        elif ph == "s":
            starts[e["id"]] = (e["tid"], ns(e["ts"]))
        elif ph == "f":
            ends[e["id"]] = (e["tid"], ns(e["ts"]))
        elif ph == "C":
            counters += 1
            if not 0 <= ns(e["ts"]) <= window:
                fail("counter sample at %s outside the window" % e["ts"])
    check_tracks(slices, window)
    if set(starts) != set(ends):
        fail("flows without both ends")
    flows = []
    for i, (tid, t) in starts.items():
        p = inside(slices.get(tid, []), t)
        if not p:
            fail("flow %d starts at %d on worker %s outside every slice" % (i, t, tid))
        ctid, ct = ends[i]
        c = inside(slices.get(ctid, []), ct)
        if not c or c[0] != ct:
            fail("flow %d ends at %d on worker %s, not at a slice's begin" % (i, ct, ctid))
        if p[0] + p[1] > c[0]:
            fail("flow %d: its producer ends after its consumer begins" % i)
        flows.append(((tid, p[0]), (ctid, c[0])))
    got = {"slices": sum(len(x) for x in slices.values()), "flows": len(flows), "counters": counters,
           "budget_dropped": meta["budget_dropped"]}
    return slices, flows, got


def read_perfetto(path):
    try:
        from google.protobuf import unknown_fields
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
    except ImportError as e:
        print("trace_check: no perfetto/protobuf Python package (%s): skipped" % e)
        sys.exit(77)
    data = open(path, "rb").read()
    t = pb.Trace()
    t.ParseFromString(data)

    def no_unknown(m, where):
        if len(unknown_fields.UnknownFieldSet(m)):
            fail("%s has fields Perfetto's definitions do not know" % where)
        for f, v in m.ListFields():
            if f.message_type is None:
                continue
            for x in (v if f.is_repeated else [v]):
                no_unknown(x, where + "." + f.name)

    seqs = {}  # id -> state
    tracks = {}  # uuid -> name
    slices, open_, flow_src, flow_dst, counters, summary = {}, {}, {}, {}, 0, None
    for k, p in enumerate(t.packet):
        no_unknown(p, "packet %d" % k)
        sid = p.trusted_packet_sequence_id
        if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            seqs[sid] = {"names": {}, "cats": {}, "an": {}, "sv": {}, "clock": None, "incr": 0, "defaults": None}
        if sid not in seqs:
            fail("packet %d on sequence %d before its state was cleared" % (k, sid))
        s = seqs[sid]
        if p.HasField("trace_packet_defaults"):
            s["defaults"] = p.trace_packet_defaults
        if p.HasField("clock_snapshot"):
            for c in p.clock_snapshot.clocks:
                if c.is_incremental:
                    s["clock"], s["incr"] = c.clock_id, c.timestamp
        if p.HasField("interned_data"):
            d = p.interned_data
            for x in d.event_names:
                s["names"][x.iid] = x.name
            for x in d.event_categories:
                s["cats"][x.iid] = x.name
            for x in d.debug_annotation_names:
                s["an"][x.iid] = x.name
            for x in d.debug_annotation_string_values:
                s["sv"][x.iid] = x.str.decode()
        clock = p.timestamp_clock_id if p.HasField("timestamp_clock_id") else (
            s["defaults"].timestamp_clock_id if s["defaults"] and s["defaults"].HasField("timestamp_clock_id") else 6)
        if clock == s["clock"]:
            s["incr"] += p.timestamp
            ts = s["incr"]
        elif clock == 6:
            ts = p.timestamp
        else:
            fail("packet %d: clock %d is neither BOOTTIME nor its sequence's" % (k, clock))
        if p.HasField("track_descriptor"):
            td = p.track_descriptor
            tracks[td.uuid] = td.thread.thread_name if td.HasField("thread") else (
                td.process.process_name if td.HasField("process") else td.name)
        if not p.HasField("track_event"):
            continue
        if not p.sequence_flags & pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE:
            fail("packet %d uses interned state without saying so" % k)
        te = p.track_event
        track = te.track_uuid if te.HasField("track_uuid") else s["defaults"].track_event_defaults.track_uuid
        if track not in tracks:
            fail("packet %d: track %d has no descriptor" % (k, track))
        if te.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            if track in open_:
                fail("%s: a slice begins at %d inside another" % (tracks[track], ts))
            if te.name_iid not in s["names"] or any(c not in s["cats"] for c in te.category_iids):
                fail("packet %d: a name not interned on its sequence" % k)
            args = {}
            for a in te.debug_annotations:
                if a.name_iid not in s["an"]:
                    fail("packet %d: an annotation name not interned" % k)
                if a.HasField("string_value_iid"):
                    if a.string_value_iid not in s["sv"]:
                        fail("packet %d: a string value not interned" % k)
                    args[s["an"][a.name_iid]] = s["sv"][a.string_value_iid]
                else:
                    args[s["an"][a.name_iid]] = a.uint_value
            open_[track] = (ts, s["names"][te.name_iid], args, list(te.flow_ids), list(te.terminating_flow_ids))
        elif te.type == pb.TrackEvent.TYPE_SLICE_END:
            if track not in open_:
                fail("%s: an END at %d with no slice open" % (tracks[track], ts))
            b, name, args, fo, fi = open_.pop(track)
            x = (b, ts - b, name, args)
            slices.setdefault(tracks[track], []).append(x)
            for f in fo:
                flow_src[f] = (tracks[track], x)
            for f in fi:
                flow_dst[f] = (tracks[track], x)
        elif te.type == pb.TrackEvent.TYPE_COUNTER:
            counters += 1
        elif te.type == pb.TrackEvent.TYPE_INSTANT and te.name == "trace summary":
            summary = {a.name: a.uint_value for a in te.debug_annotations}
    if open_:
        fail("slices never ended: %s" % list(open_))
    if summary is None:
        fail("no trace summary")
    check_tracks(slices, summary["window_ns"])
    flows = []
    for f, (ctid, c) in flow_dst.items():
        if f not in flow_src:
            fail("flow %d ends at %s on %s but starts nowhere" % (f, c[2], ctid))
        ptid, p = flow_src[f]
        if p[0] + p[1] > c[0]:
            fail("flow %d: its producer ends after its consumer begins" % f)
        flows.append(((ptid, p[0]), (ctid, c[0])))
    got = {"slices": sum(len(x) for x in slices.values()), "flows": len(flows), "counters": counters,
           "budget_dropped": summary["budget_dropped"]}
    return slices, flows, got


def expect(got, pairs):
    for kv in pairs:
        k, v = kv.split("=")
        if got[k] != int(v):
            fail("%s: %d, expected %s" % (k, got[k], v))


def main():
    mode = sys.argv[1]
    if mode == "json":
        _, _, got = read_json(sys.argv[2])
        expect(got, sys.argv[3:])
    elif mode == "perfetto":
        _, _, got = read_perfetto(sys.argv[2])
        expect(got, sys.argv[3:])
    elif mode == "same":
        js, jf, jg = read_json(sys.argv[2])
        ps, pf, pg = read_perfetto(sys.argv[3])
        if jg != pg:
            fail("counts differ: json %s, perfetto %s" % (jg, pg))
        # the same slices: JSON tid w is Perfetto's "worker w"
        for tid, xs in js.items():
            ys = ps.get("worker %d" % tid, [])
            if len(xs) != len(ys):
                fail("worker %d: %d slices in JSON, %d in Perfetto" % (tid, len(xs), len(ys)))
            for x, y in zip(xs, ys):
                a = dict(x[3])
                same = x[0] == y[0] and x[1] == y[1] and x[2] == y[2]
                for k in ("task", "step", "bucket", "launch", "wait_reason", "wait_us", "event_class", "pos",
                          "prompt_cached"):
                    same = same and a.get(k) == y[3].get(k)
                same = same and ns(a["queued_us"]) == y[3]["queued_ns"] and a["request"] == y[3].get("request")
                if not same:
                    fail("worker %d: JSON %s and Perfetto %s differ" % (tid, x, y))
        jflows = sorted(((("worker %d" % a[0]), a[1]), (("worker %d" % b[0]), b[1])) for a, b in jf)
        if jflows != sorted(pf):
            fail("the flows differ")
        got = jg
    else:
        fail("unknown mode " + mode)
    print("trace_check: %s ok: %s" % (mode, got))


main()
