#!/usr/bin/env python3
"""Writes bench/REPORT.md and the PNG plots from the JSON that `lanes bench NAME --json` printed.

Usage: bench-report.py DIR   (DIR holds the JSON of each `lanes bench NAME --json`)
"""
import json
import textwrap
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(d, name):
    p = d / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def bar(path, title, labels, series, ylabel):
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.8 / len(series)
    for k, (name, values) in enumerate(series):
        xs = [i + k * width for i in range(len(labels))]
        bars = ax.bar(xs, values, width, label=name)
        ax.bar_label(bars, fmt="%g", fontsize=8)
    ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(labels))], labels)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    if len(series) > 1:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def met(ok):
    """A goal line's verdict."""
    return "met" if ok else "**not met**"


UNITS = {"times": "{:.{d}f}x", "percent": "{:.{d}f}%", "ms": "{:.{d}f} ms", "micros": "{:,.{d}f} µs", "per_second": "{:,.{d}f}/s",
         "count": "{:,.{d}f}", "mib": "{:.{d}f} MiB"}


def show(v, g):
    """A goal's figure or bound as the bench says to show it (a figure the run could not take: n/a)."""
    if v is None:
        return "n/a"
    return UNITS[g["unit"]].format(100 * v if g["unit"] == "percent" else v, d=g["decimals"])


def judged(g):
    """Whether a goal's figure is within its bounds, both read from the JSON (unrounded). A figure or
    a bound written as null (a number the run could not take) is never within."""
    v, hi, lo = g["value"], g.get("at_most"), g.get("at_least")
    bounds = [b for b in ("at_most", "at_least") if b in g]
    return (v is not None and bool(bounds) and all(g[b] is not None for b in bounds)
            and (hi is None or v <= hi) and (lo is None or v >= lo))


def goal_lines(x):
    """A bench's goal lines, from the goals its JSON carries."""
    if "goals" not in x:
        return ["- this JSON carries no goals: run the bench above again"]
    lines = []
    for g in x["goals"]:
        hi, lo = g.get("at_most"), g.get("at_least")
        bound = (f"= {show(hi, g)}" if hi is not None and hi == lo else
                 f"{show(lo, g)} to {show(hi, g)}" if "at_most" in g and "at_least" in g else
                 f"<= {show(hi, g)}" if "at_most" in g else f">= {show(lo, g)}" if "at_least" in g else "none")
        lines.append(f"- {g['what']}: {show(g['value'], g)} (goal {bound}): {met(judged(g))}")
    return lines


def goal(x, key):
    """The goal `key` of a bench's JSON, or None."""
    return next((g for g in x.get("goals", []) if g["key"] == key), None)


def main():
    d = Path(sys.argv[1])
    out = ["# Lanes benchmarks", "",
           "Written by `make bench` (this machine; the head-of-line, fairness and throughput runs on the release build, the rest on the debug build). Each section names the command that reproduces it.", ""]
    h = load(d, "hol")
    if h:
        runs = h["runs"]
        names = [r["policy"] for r in runs]
        bar(d / "hol.png", f"Interactive latency, {h['slots']} slots, 1 s = {h['scale_ms']} ms", names,
            [("p50 ms", [round(r["interactive_latency_ms"][0]) for r in runs]),
             ("p99 ms", [round(r["interactive_latency_ms"][1]) for r in runs])], "ms")
        out += ["## Head-of-line blocking", "", f"`{h['command']}`", "",
                f"{h['tasks'][0]} interactive (0.5-2 s) and {h['tasks'][1]} synthesis (45-180 s) tasks, time-scaled, "
                "through the real pool and embedded queues and store.", "",
                "| policy | interactive wait p50 / p99 | interactive latency p50 / p99 | service p99 | synthesis/s | utilization | makespan | tail: arrived to every slot busy |",
                "|---|---:|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {r['policy']} | {r['interactive_wait_ms'][0]:.0f} / {r['interactive_wait_ms'][1]:.0f} ms | "
                f"{r['interactive_latency_ms'][0]:.0f} / {r['interactive_latency_ms'][1]:.0f} ms | "
                f"{r['interactive_service_p99_ms']:.0f} ms | {r['synthesis_per_s']:.2f} | {100 * r['utilization']:.0f}% | "
                f"{r['makespan_s']:.1f} s | {r['tail'][1]} of {r['tail'][0]} |" for r in runs]
        out += ["", *goal_lines(h), "",
                "Reading it: FIFO lets synthesis tasks (45-180 s, scaled) fill every slot, so interactive waits "
                "behind them. 70/30 with borrowing lends idle capacity without preemption; an active "
                f"interactive lane (work in the last ten workload seconds) keeps {100 * h['headroom']:.0f}% of its "
                f"reservation ({int(h['headroom'] * round(0.7 * h['slots']))} of {round(0.7 * h['slots'])} slots, rounded down) as headroom, "
                "because a slot lent to synthesis is gone for minutes. The last column splits the interactive "
                "tail (latency at or above its p99) by whether every slot was busy when each task arrived: "
                "queueing that only preemption or more headroom avoids. The time scale keeps the durable writes "
                "each task makes (submission, send, claim: a few ms of redb commits) a small part of a task.", "",
                "![hol](hol.png)", ""]
    fa = load(d, "fairness")
    if fa:
        out += ["## Fairness between tenants", "", f"`{fa['command']}`", "",
                "Three tenants send steadily (about 30% of the slots between them); in the flood runs a fourth "
                "sends 2,000 interactive and 50 synthesis tasks at once. Wait is submission to claim, latency "
                "submission to answer. Orders: `fifo` (no fairness), `fair` (the fair queue's order, token "
                "shares off), `fair+tokens` (the order and the token shares: the default). The floor is, for "
                "each task under the flood, the least wait any order could have given it without preempting "
                "a running task or holding a slot idle: none if a slot was free when it arrived, otherwise "
                "until the next interactive task of the run finished; its latency floor adds the task's own service.", "",
                "| order | flood | tenant | tasks | wait p50 | wait p99 | its floor | latency p99 | its floor | put-offs |",
                "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {r['order']} | {'yes' if r['flood'] else 'no'} | {t['tenant']} | {t['tasks']} | "
                f"{t['wait_ms'][0]:.1f} ms | {t['wait_ms'][1]:.1f} ms | "
                f"{'' if t.get('floor_ms') is None else format(t['floor_ms'][0], '.1f') + ' ms'} | "
                f"{t['latency_ms'][1]:.1f} ms | "
                f"{'' if t.get('floor_ms') is None else format(t['floor_ms'][1], '.1f') + ' ms'} | "
                f"{r['put_offs']} |" for r in fa["runs"] for t in r["tenants"]]
        floor = fa["fair_floor_over_alone"]
        share_goal = goal(fa, "flood_share_of_leftover")
        allowed = f"{100 * (1 - share_goal['at_least']):.0f}%" if share_goal else "part"
        wait_goal = goal(fa, "flood_over_alone")
        reach = ("" if wait_goal is None else "; so the wait goal is within reach of some order"
                 if floor <= wait_goal["at_most"] else "; so the wait goal is **out of reach of every order**")
        out += ["",
                f"- steady tenants' worst interactive wait p99 under the flood / alone: fair+tokens "
                f"{fa['fair_flood_over_alone']:.2f}, the fair order alone {fa['order_only_flood_over_alone']:.2f}, "
                f"FIFO {fa['fifo_flood_over_alone']:.2f}",
                f"- the same for the floor (the best any order could do without preempting or idling a slot): "
                f"{floor:.2f}{reach}",
                f"- their worst interactive latency p99 under the flood / alone, fair+tokens: "
                f"{fa['fair_latency_flood_over_alone']:.2f}; for the floor's latency (its wait plus the task's "
                f"service): {fa['fair_latency_floor_over_alone']:.2f}", "",
                "Reading it: the flood is a backlog queued before the pool starts. In FIFO order every steady "
                "task waits behind it. In the fair order the queue hands a steady tenant's task out before the "
                "flood's next while the steady tenant has fewer in flight; but a steady tenant's burst (two or "
                "three tasks running at once) holds as many as the flood holds then, and a count-fair order "
                "gives the flood its turn: that is the fair order's tail. The token shares remember the "
                "window: the flood has used far more of the lane's tokens, so a flood task decided while a "
                "steady tenant's work has waited a quarter of a (workload) second is put off, and the burst "
                "goes ahead of it. Every task reports the tokens its estimate foresaw, as a real call roughly "
                "does. What is left is the wait "
                "for a slot to free. Alone, a slot is free when a task arrives, so its wait is the pickup "
                "(a few ms); under the flood every slot is busy, and the floor column is the wait for the "
                "first one to free, which no order can shorten without preempting a task or keeping a slot "
                "idle for tenants who might come. Keeping one interactive slot idle costs the flood about a "
                f"sixth of what the others leave it, against the {allowed} the share goal allows. So the wait goal "
                "measures the time scale (slot turnover against pickup), not the order; the latency ratio "
                "is what a steady tenant sees. The flood's share counts slot time from claim to finish, so "
                "each task's receive and claim count against it.", ""]
        if fa.get("token_runs"):
            out += ["Two tenants with backlogs on one interactive lane; their tasks take the same time, but the "
                    "large tenant's report ten times the tokens. Counted over the span in which both still had "
                    "tasks to start.", "",
                    "| counted in | shares kept in | small tasks | large tasks | large tenant's token share | its task share | put-offs |",
                    "|---|---|---:|---:|---:|---:|---:|"]
            out += [f"| {'tokens' if r['token_fairness'] else 'tasks'} | {r.get('cache', 'embedded')} | {r['tasks'][0]} | {r['tasks'][1]} | "
                    f"{r['large_token_share']:.2f} | {r['large_task_share']:.2f} | {r['put_offs']} |"
                    for r in fa["token_runs"]]
            out += [""]
        out += ["Goals:", "", *goal_lines(fa), ""]
    sc = load(d, "share")
    if sc:
        out += ["### What the token shares cost Redis as a lane's tenants grow", "", f"`{sc['command']}`", "",
                "Each step of a lane's token shares is one Lua script on the lane's Redis keys, and Redis runs one "
                "script at a time: its run is time in which no other client of that Redis is answered. One lane "
                "per row with its tenants' tokens in the window and some or all of them waiting for a task (each "
                f"waiting one competes), then {sc['calls']} calls of each step by one of them through the workers' "
                "adapter against a redis-server; Redis's own time per call, from `INFO commandstats`. Then one "
                "decision a window later, which sweeps the lane.", "",
                "| tenants | waiting | submission | start decision | correction | a task (the three) | a sweep (once a window) |",
                "|---:|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {r['tenants']:,} | {r.get('waiting', r['tenants']):,} | {r['submit_us']:.1f} µs | "
                f"{r['decide_us']:.1f} µs | {r['settle_us']:.1f} µs | {r['task_us']:.1f} µs | "
                + (f"{r['sweep_us']:.1f} µs |" if "sweep_us" in r else "- |") for r in sc["rows"]]
        out += ["", *goal_lines(sc), "",
                "Reading it: a submission and a correction read and write the asking tenant's entry alone; a start "
                "decision reads the entries of the tenants waiting, kept apart from the rest, since the others' "
                "shares are its question and only a tenant with work waiting competes: its cost grows with the "
                "tenants waiting, not with those merely active. Idle tenants are dropped by a sweep that reads "
                "every entry once, at most once a window (a minute) per lane.", ""]
    rc = load(d, "recovery")
    if rc:
        runs = rc["runs"]
        bar(d / "recovery.png", "Kill 5 s into a task: time to takeover (workload s)",
            [f"{r['config']} (1 s = {r.get('scale_ms', rc['scale_ms'])} ms)" for r in runs],
            [("takeover, workload s", [round(r["takeover_workload_s"], 1) for r in runs]),
             ("bound, workload s", [r["bound_workload_s"] for r in runs])], "workload seconds")
        out += ["## Crash recovery", "", f"`{rc['command']}`", "",
                "| config | 1 s = | takeover (real) | takeover (workload) | bound |", "|---|---:|---:|---:|---:|"]
        out += [f"| {r['config']} | {r.get('scale_ms', rc['scale_ms'])} ms | {r['takeover_ms']:.0f} ms | "
                f"{r['takeover_workload_s']:.1f} s | {r['bound_workload_s']:.0f} s |" for r in runs]
        out += ["", "The bound is the lease's TTL plus its renew interval. Two "
                "workers on SQS (moto) and Redis; the one running the task is SIGKILLed. The first two runs "
                f"are at 1 s = {rc['scale_ms']} ms. SQS counts visibility in whole seconds and the adapter "
                "rounds up, so at that scale the 1.5 s lease becomes 2 s (20 workload s), and the other worker "
                "long-polls a moto that looks again only once a second for a message whose visibility ran out "
                "(`wait_for_messages(1)`; SQS answers as soon as one is visible): up to 20 workload seconds "
                "of the scaled figure are those two roundings, not the lease. So the lease is measured again "
                "at real time, where they are a second each against its 15 s, and that run carries the goal "
                "(its task answers in 30 s instead of 90). The figure is the completion less the task's time, so "
                "these runs save none of the run's text: a takeover continuing a save would answer sooner "
                "and read as a faster takeover. The static 120 s "
                "visibility leaves the task stuck for the expected ~115 s.", "", "![recovery](recovery.png)", ""]
        late = rc.get("late_kills") or []
        saved = [k for k in late if k["save_every_s"]]
        unsaved = [k for k in late if not k["save_every_s"]]
        if saved and unsaved:
            s, u = saved[0], unsaved[0]
            out += ["### Killed late: what the takeover pays for", "",
                    f"The same two workers; the one running a 90 s answer is SIGKILLed {s['killed_at_s']:.0f} s in "
                    "(two thirds of its text said), with the run's text saved every "
                    f"{s['save_every_s']:.0f} s and never. The takeover continues the saved text. `tokens_saved` counts "
                    "the saved text with the o200k tokenizer; the offline model counts four bytes a token.", "",
                    "| saves | answer after the kill | completion tokens paid by the takeover | not paid again (`tokens_saved`) | whole answer |",
                    "|---|---:|---:|---:|---:|"]
            out += [f"| {'every %.0f s' % k['save_every_s'] if k['save_every_s'] else 'never'} | "
                    f"{k['answer_after_kill_s']:.1f} s | {k['paid_tokens']} | {k['saved_tokens']} | {k['whole_tokens']} |"
                    for k in late]
            paid = goal(rc, "paid_with_saves")
            out += ["", f"With saves the answer comes {u['answer_after_kill_s'] - s['answer_after_kill_s']:.1f} "
                    "workload s sooner." + (" Killed two thirds in and saving every ninth of the answer, the takeover "
                    f"should pay for at most {show(paid['at_most'], paid)} of what it pays without saves." if paid else ""), ""]
        out += ["Goals:", "", *goal_lines(rc), ""]
    tp = load(d, "throughput")
    if tp:
        runs = tp["runs"]
        bar(d / "throughput.png", f"Throughput, {tp['clients']} clients", [r["backend"] for r in runs],
            [("ingress/s", [round(r["ingress_per_s"]) for r in runs]), ("tasks/s", [round(r["tasks_per_s"]) for r in runs])],
            "per second")
        out += ["## Throughput", "", f"`{tp['command']}`", "",
                "| backend | tasks | ingress/s | ingress p50 / p99 | tasks/s | task latency p50 / p99 | peak memory "
                "| server CPU per task | written to disk per task |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {r['backend']} | {r['tasks']} | {r['ingress_per_s']:.0f} | {r['ingress_latency_ms'][0]:.1f} / "
                f"{r['ingress_latency_ms'][1]:.1f} ms | {r['tasks_per_s']:.0f} | {r['task_latency_ms'][0]:.0f} / "
                f"{r['task_latency_ms'][1]:.0f} ms | {r['peak_rss_mib']:.0f} MiB | "
                f"{r.get('server_cpu_ms_per_task', 0):.3f} ms | {r.get('disk_kib_per_task', 0):.1f} KiB |" for r in runs]
        emb = next((r for r in runs if r["backend"] == "embedded"), None)
        rate_goal = goal(tp, "tasks_per_s")
        if emb:
            out += ["", *goal_lines(tp)]
        if emb and "server_cpu_ms_per_task" in emb and rate_goal:
            goal_rate = rate_goal["at_least"]
            need = goal_rate * emb["server_cpu_ms_per_task"] / 1000
            out += [*([f"- the writer thread: {eg['per_task']:.3f} groups a task at {eg['mean_ms']:.2f} ms each is "
                       f"{eg['per_task'] * eg['mean_ms']:.3f} ms of its time a task, so it was busy "
                       f"{100 * emb['tasks_per_s'] * eg['per_task'] * eg['mean_ms'] / 1000:.0f}% of the run; one thread "
                       f"allows {1000 / (eg['per_task'] * eg['mean_ms']):,.0f} tasks/s at that cost, and {goal_rate:,.0f} need "
                       f"it at most {1000 / goal_rate:.2f} ms a task"]
                      if (eg := emb.get("group_commits")) else []),
                    f"- at {goal_rate:,.0f} tasks/s the server alone would use {need:.1f} of the {tp['cores']} cores "
                    f"({emb['server_cpu_ms_per_task']:.3f} ms of CPU per task) and write "
                    f"{goal_rate * emb['disk_kib_per_task'] / 1024:.0f} MiB/s ({emb['disk_kib_per_task']:.1f} KiB per task), "
                    "before the clients' CPU"
                    + (f" ({emb['client_cpu_ms_per_task']:.3f} ms per task: "
                       f"{emb['client_cpu_ms_per_task'] * emb['ingress_per_s'] / 1000:.2f} of a core at the rate "
                       "measured, the bench's own `/proc` counters while its clients submit)"
                       if "client_cpu_ms_per_task" in emb else ""),
                    "",
                    "Reading it: every durable write of the embedded backend goes through one writer thread, which "
                    "runs the writes waiting in one redb transaction and commits them with one flush (group commit), "
                    "so a write costs its share of a flush rather than a flush. A task makes four such writes (its "
                    "record and its message, which are one write, so a POST waits for one flush; the claim; the final "
                    "write; the message's delete, which a worker does not wait for: it deletes work already durable, "
                    "and a delete lost to a crash only delivers a finished task again, which is acked as a duplicate), "
                    "plus its share of a receive's, and each rewrites "
                    "the B-tree pages it touches (copy-on-write): the disk column. The CPU column is the server's own "
                    "(HTTP, JSON, the pool, the writer), measured from its `/proc` counters; the bench's clients share "
                    "the same cores. The last line is what the goal rate would take of this machine at today's cost "
                    "per task. A profile of the server under this load (`perf record` on a 20,000-task run) finds no "
                    "single hot spot: the writer thread takes about half of the server's CPU, more than half of that "
                    "committing (the page writes and checksums, `fdatasync`, the freed pages' bookkeeping) and the "
                    "rest running the writes (each record read, decoded and encoded again); the runtime threads' time "
                    "is spread over HTTP, JSON, the queue, the lease and the allocator. Task records are keyed by "
                    "their creation time, then their id, so the records one group commit writes share the leaves at "
                    "the tree's right edge; keyed by the id alone, a hash, each of a task's three record writes "
                    "dirtied a leaf of its own (the before-and-after table). Single runs on this machine vary by "
                    "about 15%; the before-and-after table compares builds in alternated runs."
                    + (f" Ingress outran the workers in this run ({emb['ingress_per_s']:.0f} against "
                       f"{emb['tasks_per_s']:.0f} a second), so tasks waited in the queue: the task latency column. "
                       "A worker slot waits for two flushes in a row per task (the claim, the final write)."
                       if emb["ingress_per_s"] > 1.05 * emb["tasks_per_s"] else "")]
        opens = tp.get("open_loop", [])
        if opens:
            out += ["", "The same server offered tasks on a fixed schedule (open loop): nothing waits for an answer "
                    "before the next POST leaves, so a server that falls behind is charged for every wait it causes. "
                    f"A closed loop's mean latency is its client count over its rate (Little's law: {tp['clients']} "
                    f"clients at {emb['ingress_per_s']:.0f} a second is {1000 * tp['clients'] / emb['ingress_per_s']:.1f} "
                    "ms), so its p99 is the saturated queue's; these rows are the server's latency below its limit. "
                    "Each POST is timed from the moment it left. The schedule's timer ticks every millisecond, so a "
                    "POST leaves up to a tick after its time; that lateness is the bench's and is given apart.", "",
                    "| offered tasks/s | POSTs left late, p99 | ingress p50 / p99 | tasks/s | task latency p50 / p99 "
                    "| server CPU per task | written to disk per task |",
                    "|---:|---:|---:|---:|---:|---:|---:|"]
            out += [f"| {o['offered_per_s']:.0f} | {o.get('late_p99_ms') or 0:.2f} ms "
                    f"| {o['ingress_latency_ms'][0]:.1f} / {o['ingress_latency_ms'][1]:.1f} ms "
                    f"| {o['tasks_per_s']:.0f} | {o['task_latency_ms'][0]:.0f} / {o['task_latency_ms'][1]:.0f} ms "
                    f"| {o['server_cpu_ms_per_task']:.3f} ms | {o['disk_kib_per_task']:.1f} KiB |" for o in opens]
            loads = [(f"closed loop, {tp['clients']} clients", emb)] + [(f"open loop, {o['offered_per_s']:.0f} a second", o) for o in opens]
            loads = [(name, r["group_commits"]) for name, r in loads if r.get("group_commits")]
            if loads:
                out += ["", "The embedded file's group commits in the same runs (the server's "
                        "`lanes_embedded_group_commit*` series):", "",
                        "| load | group commits a task | writes a commit | a group's time (its writes run, committed, flushed), mean / p99 at most |",
                        "|---|---:|---:|---:|"]
                out += [f"| {name} | {g['per_task']:.3f} | {g['writes_per_commit']:.1f} | {g['mean_ms']:.2f} / "
                        f"{g['p99_bucket_ms']:g} ms |" for name, g in loads]
            tail = [o for o in opens if o.get("group_commits")
                    and o["ingress_latency_ms"][1] > 2 * o["group_commits"]["p99_bucket_ms"]]
            out += ["", "Reading it: a POST waits for the group commit under way, then for its own, so the writer "
                    "accounts for about one and a half groups of a POST's time; a group is its writes' CPU plus one "
                    "`fdatasync`. Below the limit the groups are smaller, so each task carries a larger share of a "
                    "commit: the CPU and disk columns rise as the load falls."
                    + "".join(f" Offered {o['offered_per_s']:.0f} a second, the POST p99 "
                              f"({o['ingress_latency_ms'][1]:.1f} ms) is more than two groups at their p99 "
                              f"({o['group_commits']['p99_bucket_ms']:g} ms at most): the writer does not explain "
                              f"that tail. One in a hundred of the bench's own POSTs left more than {o['late_p99_ms']:.1f} ms "
                              "after its time, waiting for a core as the server's threads do: the client and the "
                              "server share two."
                              for o in tail[:1])]
        samples = ", ".join(f"{r.get('latency_samples', 0):,} on {r['backend']}" for r in runs)
        out += ["", f"Release build (`--profile profiling`: the release profile with symbols), offline model with no "
                f"latency, {tp.get('capacity', 16)} worker slots. Task latency is over every completed task "
                f"({samples}), from the server's own timestamps (accepted to finished); tasks/s is from the "
                "first submission to the last completion. Each backend also runs alone with `--backend embedded` or "
                "`--backend aws`. moto is an emulator, so the Redis + moto row measures the code paths, not AWS's "
                "speed.", "", "![throughput](throughput.png)", ""]
    so = load(d, "soak")
    if so:
        out += ["## Soak", "", f"`{so['command']}`", "",
                f"`lanes dev` on embedded defaults (release build, offline model with no latency), {so['tasks']:,} "
                f"interactive tasks from {so['clients']} clients; records kept {so['record_ttl_secs']} s and swept every "
                f"{so['sweep_secs']} s, so the live data stays bounded while the work grows; "
                f"{so.get('capacity', 16)} worker slots. The backlog is the interactive queue's messages waiting or in "
                "flight at the end of each tenth (the server's `/metrics`): a bounded backlog means the workers keep "
                "up, so tasks/s is the rate at which tasks finish, not only at which they are accepted.", "",
                "| tenth | tasks/s | RSS | backlog | data file |", "|---:|---:|---:|---:|---:|"]
        out += [f"| {k + 1} | {t['tasks_per_s']:.0f} | {t['rss_mib']:.0f} MiB | {t.get('backlog', '')} | "
                + (f"{t['file_mib']:.1f} MiB |" if "file_mib" in t else " |")
                for k, t in enumerate(so["tenths"])]
        if "warmup_tasks" in so:
            out += ["", f"The tenths start after a warm-up of {so['warmup_tasks']:,} tasks "
                    f"({so['warmup_tasks_per_s']:.0f} tasks/s) that lasts the records' TTL and two sweeps, so they "
                    "measure a data file at its steady size, where as many records expire as are written, not one "
                    "growing from empty"
                    + (f" (the file was {so['warmup_file_mib']:.1f} MiB at its end)." if "warmup_file_mib" in so else ".")]
        out += ["", *goal_lines(so),
                f"- data file {so['file_bytes'] / 1048576:.1f} MiB against {so['live_bytes'] / 1048576:.1f} MiB live "
                "(a compacted copy); RSS compared over the tenths where it was read, as for the functions",
                f"- peak RSS {so['peak_rss_mib']:.0f} MiB; tasks unfinished at the end: {so['unfinished']}", ""]
        if "in_use_bytes" in so:
            tenths = [t["file_mib"] for t in so["tenths"]]
            grew = max(tenths) - so["warmup_file_mib"]
            in_use, live = so["in_use_bytes"] / 1048576, so["live_bytes"] / 1048576
            kept = ("what is kept is what is live" if in_use <= 1.05 * live else
                    f"{in_use - live:.1f} MiB more in use than the compacted copy needs")
            out += [f"Reading it: at the end {in_use:.1f} MiB of the file's pages were in use "
                    f"(redb's allocated pages), against {live:.1f} MiB in the compacted copy: {kept}. redb keeps a file of up to 4 GiB as one region and grows it by "
                    "doubling whenever a write finds no free page; it gives space back only once the upper half of "
                    "the file is free, half of that free tail at a time. So the file's size follows the most pages "
                    "ever in use at once (up to twice that), not the live data at the end: "
                    + (f"it grew by {grew:.1f} MiB after the warm-up. " if grew > 0 else "it did not grow after the warm-up. ")
                    + "The live data at the end can be below that peak: records kept "
                    f"{so['record_ttl_secs']} s and swept every {so['sweep_secs']} s hold between "
                    f"{so['record_ttl_secs']} and {so['record_ttl_secs'] + so['sweep_secs']} s of tasks, and the rate "
                    f"changes over the run. So whether the file is over {show(size['at_most'], size)} the live data "
                    "depends on where that peak falls against the doubling steps: a peak just over a step doubles "
                    "the file." if (size := goal(so, "file_over_live")) else "changes over the run.", ""]
    st = load(d, "stream")
    if st:
        out += ["## Streaming answers", "", f"`{st['command']}`", "",
                f"`lanes dev` calls the provider emulator, which streams every answer as {st['chunks']} chunks of "
                f"{st['chunk_bytes']} bytes, {st['interval_ms']} ms apart, each stamped with the time it wrote it. A "
                "client follows each task over `GET /v1/tasks/{id}/events`; per piece of text, the time from the "
                "provider writing it to the client reading it (the worker's read, the append to the log, the "
                "reader's wake-up, the SSE write).", "",
                "| log | tasks at once | deltas made the result | deltas per task | per piece p50 / p99 / max | "
                "provider's first chunk p50 / p99 | first delta p50 / p99 | gap p99 (provider's) |",
                "|---|---:|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {r['backend']} | {r['tasks']} | {r['complete']} of {r['tasks']} | {r['deltas_per_task']:.1f} | "
                f"{r['overhead_ms'][0]:.1f} / {r['overhead_ms'][1]:.1f} / {r['overhead_ms'][2]:.1f} ms | "
                f"{r['provider_first_ms'][0]:.0f} / {r['provider_first_ms'][1]:.0f} ms | "
                f"{r['first_delta_ms'][0]:.0f} / {r['first_delta_ms'][1]:.0f} ms | "
                f"{r['client_gap_p99_ms']:.1f} ({r['provider_gap_p99_ms']:.1f}) ms |" for r in st["runs"]]
        out += ["", "The server's resident memory with clients following one answer (embedded log), read halfway "
                "through it, for an answer (400 chunks of 256 bytes, 20 ms apart) and one four times as long at the "
                "same pace:", "",
                "| answer | subscribers | resident | deltas made the result |", "|---:|---:|---:|---:|"]
        out += [f"| {m['answer_kib']:.0f} KiB | {p['subscribers']} | {p['rss_mib']:.1f} MiB | "
                f"{p['complete']} of {p['subscribers']} |" for m in st["memory"] for p in m["points"]]
        per = "; ".join(f"{m['per_subscriber_kib']:.1f} KiB ({m['answer_kib']:.0f} KiB answer)" for m in st["memory"])
        flat = goal(st, "longer_answer_ratio")
        out += ["", f"- an extra subscriber costs: {per}", *goal_lines(st), "",
                "Reading it: a reader holds at most 16 events its client has not taken (a page of the log), and a "
                "slow client's socket stops its reader rather than the server buffering for it, so the text is kept "
                "once, in the log. " + (
                    "" if flat is None else
                    "So an extra subscriber costs about the same whatever the length of the answer it reads."
                    if judged(flat) else
                    "Yet the per-subscriber cost grows with the answer: something a reader holds grows with what it "
                    "reads, and is not found yet."), ""]
    fn = load(d, "functions")
    if fn:
        out += ["## Lambda functions' memory", "", f"`{fn['command']}`", "",
                f"The real Lambda binaries (release build) under the harness's Lambda emulator with their "
                f"`template.yaml` settings, against moto and redis-server: {fn['tasks']:,} tasks (one in ten "
                f"synthesis) posted to ingress as API Gateway events, {fn['concurrency']} at a time, and each worker "
                "invoked with the SQS batches its event source mapping builds (its `BatchSize`), the mapping's deletes "
                "included. Warm environments are reused, as Lambda reuses them. RSS is the largest resident set of a "
                "function's environments at the end of a tenth of the run; KiB/call is its growth from the first "
                "tenth to the last over the function's calls in between (spread over several environments, a lower "
                f"bound on one environment's). The run took {fn['seconds']:.0f} s; tasks unfinished: {fn['unfinished']}.",
                "", "| function | calls | environments | RSS, first tenth | RSS, last tenth | last / first | KiB/call | peak |",
                "|---|---:|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {x['function']} | {x['invocations']} | {x['environments']} | {x['rss_mib'][0]:.1f} MiB | "
                f"{x['rss_mib'][9]:.1f} MiB | {x['last_over_first']:.2f} | {x['growth_kib_per_invocation']:.2f} | "
                f"{x['peak_mib']:.1f} MiB |" for x in fn["functions"]]
        out += ["", *goal_lines(fn), ""]
    cs = load(d, "coldstart")
    if cs:
        base = cs["baseline"]
        out += ["## Cold start", "", f"`{cs['command']}`", "",
                f"Init is the time from exec to the function's first `GET /runtime/invocation/next` on a local runtime-API "
                f"emulator ({cs['init_arch']}, median and p90 of {cs['starts']} starts), with the template's environment "
                "pointed at moto and redis-server and the AWS SDK trusting Amazon's roots as it does in Lambda; the zip is "
                "the arm64 package as `sam build` makes it (cargo-lambda, release profile). Each start is an on-demand cold "
                "start (`AWS_LAMBDA_INITIALIZATION_TYPE=on-demand`), so the webhook and the commits worker read their "
                "secrets at first use, not during init. The functions run on a current-thread runtime; the baseline is "
                "the library's hello-world example as written (`#[tokio::main]`). The first response is the time from "
                "exec to the webhook's answer to a signed GitHub ping given as its first event: init, the secret's read "
                "and the check. An init that reads the secrets ahead (as one that runs before any event does: "
                "provisioned concurrency), given its event at its first poll like the others, is shown apart and not "
                "held to the init goal. Reading ahead moves the "
                "read's CPU into the init and overlaps its round trip with the event's delivery (compare the two "
                "webhook rows).", "",
                "| function | init median | init p90 | x baseline | zip | first response |",
                "|---|---:|---:|---:|---:|---:|",
                f"| baseline (hello-world lambda_runtime) | {base['init_ms']:.1f} ms | {base['init_p90_ms']:.1f} ms | 1.00 | "
                f"{base['zip_bytes'] / 1048576:.2f} MiB | - |"]
        def row(name, m):
            first = f"{m['first_response_ms']:.1f} ms" if m.get("first_response_ms") is not None else "-"
            return (f"| {name} | {m['init_ms']:.1f} ms | {m['init_p90_ms']:.1f} ms | "
                    f"{m['init_ms'] / max(base['init_ms'], 1e-9):.2f} | {m['zip_bytes'] / 1048576:.2f} MiB | {first} |")
        out += [row(name, m) for name, m in cs["functions"].items()]
        out += [row(f"{name}, reading its secrets ahead (not held to the goal)", m)
                for name, m in cs.get("read_ahead", {}).items()]
        out += ["", *goal_lines(cs), ""]
    history = load(d, "before-after")
    if history:
        out += ["## Before and after", "", history["note"], "",
                "| measure | before | after | command |", "|---|---:|---:|---|"]
        out += [f"| {r['measure']} | {r['before']} | {r['after']} | `{r['command']}` |" for r in history["rows"]]
        out += [""]
    b = load(d, "batching")
    if b:
        runs = b["runs"]
        bar(d / "batching.png", f"{b['commits']} commits: LLM calls", [r["mode"] for r in runs],
            [("LLM calls", [r["llm_calls"] for r in runs])], "calls")
        out += ["## Batching", "", f"`{b['command']}`", "",
                "| mode | LLM calls | prompt tokens | completion tokens | by rule | 429s | seconds |",
                "|---|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {r['mode']} | {r['llm_calls']} | {r['prompt_tokens']} | {r['completion_tokens']} | "
                f"{r['rule_summaries']} | {r['throttled']} | {r['seconds']:.1f} |" for r in runs]
        m, s = runs[0], runs[1]
        out += ["", f"Micro-batching: {s['llm_calls'] / max(m['llm_calls'], 1):.1f}x fewer calls, "
                f"{100 * (1 - m['prompt_tokens'] / max(s['prompt_tokens'], 1)):.1f}% fewer prompt tokens; "
                f"429s: {m['throttled']}.", "", *goal_lines(b), "", "![batching](batching.png)", ""]
    c = load(d, "cost")
    if c:
        runs = c["runs"]
        sync = runs[0]
        bar(d / "cost.png", f"{sync['commits']} commits of {c['repo']}: cost at each tier policy",
            ["\n".join(textwrap.wrap(r["mode"], 12)) for r in runs], [("USD", [r["cost_usd"] for r in runs])], "USD")
        out += ["## Cost by service tier", "", f"`{c['command']}`", "",
                f"The newest {sync['commits']} commits of this repository through the commits pipeline (`lanes summarize`'s, "
                f"embedded adapters, real diffs) and the route stack (retries, the route's flex handling, the OpenAI "
                f"client) against the provider emulator, which answers flex calls {c['flex_latency_ms']} ms slower. "
                f"Priced as {c['model']} (flex and batch at OpenAI's half price). The `batch` rows hand the commits "
                f"to the emulator of OpenAI's Files and Batch APIs and collect them as the collector does; it runs at "
                f"a scaled time (200 ms to validate, 5 ms a request, where OpenAI takes minutes to hours), so their "
                f"enqueue-to-summary times are that scale's, and in the second the provider's window passes when half "
                f"of each batch is answered.", "",
                "| policy | summaries | calls | requests | flex asked | flex refused | served at flex | served at batch | "
                "enqueue to summary p50 / p99 | deadlines missed | answered twice | cost |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {r['mode']} | {r['summaries']} | {r['llm_calls']} | {r['requests']} | {r['flex_asked']} | "
                f"{r['flex_refused']} | {r['served_at_flex']} | {r.get('served_at_batch', 0)} | "
                f"{r['summary_p50_ms']:.0f} / {r['summary_p99_ms']:.0f} ms | "
                f"{r['deadlines_missed']} | {r['duplicates']} | ${r['cost_usd']:.6f} |" for r in runs]
        out += [""] + [f"- {r['mode']}: {100 * r['cost_usd'] / sync['cost_usd']:.1f}% of sync's cost"
                       for r in runs[1:] if sync["cost_usd"]]
        out += [*goal_lines(c), "",
                "Reading it: `auto` chooses flex while the deadline leaves 15 minutes for a slow flex call; a refused "
                "flex call is made again at sync on the same route, so the refusal row pays list price for the "
                "commits of that one call and loses none; a deadline shorter than the headroom never waits for flex. "
                "The run takes seconds against six-hour deadlines, so no deadline can be missed here: the column checks "
                "that choosing a tier never delays a summary, not how the escalation behaves near a deadline (the "
                "tier rule's unit tests do). Flex's half price is OpenAI's published rate as the price table holds it: "
                "what is measured is which calls the pipeline makes at which tier, not the discount. A batch's "
                "escalation near its deadline (cancelled, then its unanswered commits sent on at flex) is checked "
                "on a manual clock by `tests/tests/batches.rs`, not here.", "",
                "![cost](cost.png)", ""]
    du = load(d, "duplicates")
    if du:
        runs = du["runs"]
        labels = [f"{r['flow']}\n{r['config']}" for r in runs]
        bar(d / "duplicates.png", f"{runs[0]['deliveries']} deliveries, model {du['llm_ms']} ms > visibility "
            f"{du['visibility_ms']} ms", labels, [("LLM calls", [r["llm_calls"] for r in runs])], "calls")
        out += ["## Duplicates", "", f"`{du['command']}`", "",
                "| flow | config | deliveries | LLM calls | rejected writes | finished | seconds |",
                "|---|---|---:|---:|---:|---|---:|"]
        out += [f"| {r['flow']} | {r['config']} | {r['deliveries']} | {r['llm_calls']} | {r['rejected_writes']} | "
                f"{r['finished']} | {r['seconds']:.1f} |" for r in runs]
        out += ["", *goal_lines(du), "", "With a static "
                "visibility shorter than the model every redelivery pays again; the fence (tasks) and the "
                "write-once condition (commits) still keep a single stored result, and a task can livelock "
                "(each redelivery moves the fence past the worker still running).", "",
                "![duplicates](duplicates.png)", ""]
    li = load(d, "limiter")
    if li:
        out += ["## LLM limiter", "", f"`{li['command']}`", "", "| measure | value |", "|---|---:|",
                f"| {li['requests']} requests from {li['workers']} workers: 429s | {li['throttled']} |",
                f"| token throughput, of the limit | {100 * li['throughput_of_limit']:.1f}% |",
                f"| both lanes saturated: interactive share (reserved 70%) | {100 * li['interactive_share_saturated']:.1f}% |",
                f"| interactive idle: background throughput, of the limit | {100 * li['background_alone_of_limit']:.1f}% |", ""]
    pv = load(d, "provider")
    if pv:
        runs = pv["runs"]
        labels = [f"{r['discipline']}\n{r['limits']}" for r in runs]
        bar(d / "provider.png", "Provider emulator: 429s and use of the limit", labels,
            [("429 %", [round(100 * r["throttled_share"], 2) for r in runs]),
             ("% of limit", [round(100 * r["tokens_of_limit"], 1) for r in runs])], "%")
        out += ["## Provider limits", "", f"`{pv['command']}`", "",
                f"Eight workers (five interactive, three background) flat out for {pv['seconds']:.0f} s per run "
                f"against an emulator allowing {pv['rpm']:.0f} requests and {pv['tpm']:.0f} tokens per one-second "
                "window, through the real client stack (retries over the limiter over the OpenAI client).", "",
                "| discipline | limits | requests | 429s | 429 % | of limit | failed | put off | p99 call | interactive |",
                "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {r['discipline']} | {r['limits']} | {r['requests']} | {r['throttled']} | "
                f"{100 * r['throttled_share']:.2f}% | {100 * r['tokens_of_limit']:.1f}% | {r['failed']} | {r['put_off']} | "
                f"{r['call_p99_ms']:.0f} ms | {100 * r['interactive_share']:.1f}% |" for r in runs]
        out += [""]
        alone = pv.get("alone", [])
        if alone:
            a0 = alone[0]
            out += [f"Interactive tasks alone ({a0['tasks']} tasks from six workers) against a fixed-window provider "
                    f"allowing {a0['requests_per_window']:.0f} requests per {a0['window_secs']:.0f}-second window "
                    "(a provider's 30 requests a minute, scaled): the background's idle reservation must be lent whole.", "",
                    "| limits | time to finish | time the limit allows | of the limit | after the first window | 429s | unanswered |",
                    "|---|---:|---:|---:|---:|---:|---:|"]
            out += [f"| {r['limits']} | {r['seconds']:.2f} s | {r['limit_seconds']:.2f} s | {100 * r['of_limit']:.1f}% | "
                    f"{100 * r['after_first_window']:.1f}% | {r['throttled']} | {r['unanswered']} |" for r in alone]
            out += [""]
            proxied = pv.get("litellm", [])
            if proxied:
                p0 = proxied[0]
                out += [f"The same {p0['tasks']} tasks against a real LiteLLM proxy ({pv.get('litellm_version', 'version unknown')}) "
                        f"allowing {p0['requests_per_window']:.0f} requests a minute (its `enforce_model_rate_limits` check: "
                        "calendar minutes, a 429 with `retry-after: 60` past the limit, the limit and what is left of it in "
                        "every answer's headers but not when the minute ends), in real time. Each run starts a second into "
                        "the proxy's minute: the worst moment for the calls made before the limit is known, as nearly all of "
                        "that minute is still to come. With the limit learned, the first answer says what is left but not "
                        "when the minute ends, so the limiter takes the minute as just begun: what is left must last a "
                        "whole minute.", "",
                        "| limits | time to finish | time the limit allows | of the limit | after the first minute | 429s | unanswered |",
                        "|---|---:|---:|---:|---:|---:|---:|"]
                out += [f"| {r['limits']} | {r['seconds']:.1f} s | {r['limit_seconds']:.0f} s | {100 * r['of_limit']:.1f}% | "
                        f"{100 * r['after_first_window']:.1f}% | {r['throttled']} | {r['unanswered']} |" for r in proxied]
                out += [""]
        out += ["Goals (of the limit alone: the whole run with the limits configured, from the end of the first "
                "window or minute once learned):", "", *goal_lines(pv), ""]
        burst = pv.get("burst", 0.05)
        out += [
                f"Reading it: the pacing admits a {100 * burst:.0f}% burst and refills the other "
                f"{100 * (1 - burst):.0f}% of each window, so about {100 * (1 - burst):.0f}% of the "
                "limit is the design's use under saturation. Each 429 pauses every worker for the provider's hint "
                "(up to the rest of a one-second window here). Before the first answer the limits are unknown and "
                "the first calls are unpaced; that answer's remaining budget (less the calls in flight) lines the "
                "buckets up with the provider's window, charging the unpaced calls to the answered call's class. The "
                "interactive share is the 70% reservation less the background's refill lent back in the instants "
                "when no interactive call is waiting; alone, a class gets the other's whole refill. The last row is a "
                "provider that says nothing: its limits are inferred at its first 429 from what got through.", "",
                "![provider](provider.png)", ""]
    sim = load(d, "sim")
    if sim:
        enough = 100_000
        broken = sum(sim["violations"].values())
        failing = ", ".join(f"{seed} ({'/'.join(v)})" for seed, v in sim.get("failing_seeds", {}).items())
        seeds = f"; failing seeds: {failing}" if failing else ""
        out += ["## Lifecycle simulation", "", f"`{sim['command']}`", "",
                f"{sim['histories']:,} histories from seed {sim['first_seed']} in {sim['elapsed_secs'] / 60:.1f} min "
                f"({sim['histories_per_minute']:.0f} a minute on this machine's two cores, {sim.get('build', 'debug')} build), "
                f"{sim['faults_per_history']:.0f} faults injected and {sim['simulated_secs_per_history']:.0f} simulated "
                f"seconds per history, {sim['runs']:,} task runs.", "",
                "| invariant | histories that exercised it | violations |", "|---|---:|---:|"]
        out += [f"| {k} | {sim['exercised'].get(k, 0):,} | {v} |" for k, v in sim["violations"].items()]
        calls = ", ".join(f"{c} calls: {n:,}" for c, n in sim["calls_per_run"].items())
        minutes = enough / max(sim["histories_per_minute"], 1e-9)
        out += ["", f"- Model calls per run, tasks by count: {calls}; extra calls the simulation's breaks justify: "
                f"{sim['justified_extra_calls']:,}.",
                f"- 0 violations: {'met' if broken == 0 else '**not met**'} ({broken}{seeds}).",
                f"- At least {enough:,} histories: {'met' if sim['histories'] >= enough else '**not met**'} "
                f"({sim['histories']:,}; {enough:,} take about {minutes:.0f} min at this rate).", ""]
    rv = load(d, "sim-reverts")
    if rv:
        out += ["### The simulation finds the old defects", "", f"`{rv['command']}`", "",
                "Each row puts back one fixed defect's old code, builds `lanes` and runs `lanes sim` from seed 1 until a "
                "history breaks an invariant.", "",
                "| fix | old behaviour | histories until a violation | seed | invariant | what it saw |",
                "|---|---|---:|---:|---|---|"]
        for r in rv["reverts"]:
            if not r.get("applied"):
                out.append(f"| {r['fix']} | {r['what']} | (revert no longer applies) | | | |")
                continue
            found = r["histories_run"] if r["found"] else f"none in {r['histories_run']}"
            out.append(f"| {r['fix']} | {r['what']} | {found} | {r['seed'] or ''} | {', '.join(r['invariants'])} | "
                       f"{r['detail'] or ''} |")
        missed = [r["fix"] for r in rv["reverts"] if r.get("applied") and not r["found"]]
        out += ["", f"- Every revert found: {'met' if not missed else '**not met** (' + ', '.join(missed) + ')'}", ""]
    (d / "REPORT.md").write_text("\n".join(out))
    print(f"wrote {d / 'REPORT.md'}")


if __name__ == "__main__":
    main()
