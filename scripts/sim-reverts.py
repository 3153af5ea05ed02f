#!/usr/bin/env python3
"""Shows that the lifecycle simulation finds what it must: puts back, one at a time, the code of
fourteen lifecycle defects that the current code fixes (of the task flow, the commits flow and the
provider batches of both; docs/ARCHITECTURE.md, Lifecycle simulation), builds
`lanes` from that, and runs `lanes sim` until the first history breaks an invariant. Writes
bench/sim-reverts.json (how many histories each took, which seed, which invariant), which
scripts/bench-report.py renders.

Usage: scripts/sim-reverts.py [HISTORIES]   (default 3000 per revert; run from the repository root;
LANES_REVERTS_ONLY=a,b runs only those reverts and keeps the other rows of the JSON)

Each revert is a text replacement of today's fix by the old code; when the code around a fix has
changed, the replacement no longer applies and the script says so rather than guessing.
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REVERTS = {
    "unsent-record": ("a failed send deletes the record a duplicate was answered 202 for", [
        ("shared/src/tasks/ingress.rs", "ing.mark_unsent(&record, now).await;",
         "let _ = ing.store.delete_pending(&record.task_id, &record.nonce).await;"),
    ]),
    "lock-beside-visibility": ("the lock is renewed only after the visibility renewal returns", [
        ("shared/src/lease/heartbeat.rs", """                let visibility = async {
                    let renewed =
                        tokio::time::timeout(every, queue.change_visibility_many(&receipts, ttl)).await;
                    drop(in_round);
                    renewed.unwrap_or_else(|_| {
                        receipts
                            .iter()
                            .map(|_| Err(QueueError::Unavailable("renewal timed out".into())))
                            .collect()
                    })
                };""", """                let renewed = queue.change_visibility_many(&receipts, ttl).await;
                drop(in_round);"""),
        ("shared/src/lease/heartbeat.rs", "let (renewed, locked) = tokio::join!(visibility, locks);", "let locked = locks.await;"),
    ]),
    "resend-claim": ("every poll past the grace re-sends, before any claim of the re-send", [
        ("shared/src/tasks/enqueue.rs",
         "let wait = grace.max(record.enqueued_at_ms.saturating_sub(record.created_at_ms));", "let wait = grace;"),
        ("shared/src/tasks/enqueue.rs", """        if !self.mark(&record.task_id, claim, now).await {
            return; // another reader re-sends it, or it changed
        }
""", ""),
        ("shared/src/tasks/enqueue.rs",
         "            Ok(_) => self.metrics.resends_total.with_label_values(&[record.lane.as_str()]).inc(),",
         "            Ok(_) => {\n                self.mark(&record.task_id, claim, now).await;\n            }"),
    ]),
    "quota-after-lookup": ("the daily budget is checked before the idempotent lookup", [
        ("shared/src/tasks/ingress.rs", """        let stored = ing.store.get(&record.task_id, now).await.map_err(|e| store_problem(&e, retry_after))?;
        return match idempotency::from_record(stored, &payload_hash) {
            Some(duplicate) => answer_duplicate(ing, duplicate, Answered::ByStore, now).await,
            None => Err(over_budget(&record.request.project_id, over)),
        };""", "        return Err(over_budget(&record.request.project_id, over));"),
    ]),
    "commits-store-wait": ("a store outage is an attempt for the commits worker, which dead-letters the commit", [
        ("shared/src/commits/worker.rs",
         'groups[g].outcome = Some(GroupEnd::Wait { after, reason: "store unavailable".into() });',
         'groups[g].outcome = Some(GroupEnd::Retry { after, reason: "store unavailable".into() });'),
    ]),
    "delivery-after-enqueue": ("the webhook records a delivery before its commits are enqueued", [
        ("shared/src/commits/webhook.rs", """    if let Some(d) = &delivery
        && let Some(answer) = replayed(w, provider, d).await?
    {
        return Ok(answer);
    }
    w.enqueue(&push).await?;
    if let Some(d) = &delivery
        && let Err(e) = w.store.mark_delivery(d, w.clock.now_ms(), DELIVERY_TTL_SECS).await
    {
        warn!(error = %e, "delivery not recorded; a replay of it enqueues its commits again");
    }
""", """    if let Some(d) = &delivery {
        match w.store.mark_delivery(d, w.clock.now_ms(), DELIVERY_TTL_SECS).await {
            Ok(true) => {}
            Ok(false) => return replayed(w, provider, d).await.map(|a| a.unwrap_or_default()),
            Err(_) => return Err(Problem::unavailable("the store is unavailable; redeliver later", 30)),
        }
    }
    w.enqueue(&push).await?;
"""),
    ]),
    "group-lease-carrier": ("any delivery of a commit whose receipt is refused stops the commit's run", [
        ("shared/src/commits/worker.rs",
         "let lost = if carrier { groups[g].lost.clone() } else { CancellationToken::new() };",
         "let lost = if carrier { groups[g].lost.clone() } else { groups[g].lost.clone() };"),
    ]),
    "summary-write-again": ("a failed summary write puts the paid answer off at once", [
        ("shared/src/commits/worker.rs", """        let written = lease::ask_thrice(
            || self.summaries.put_summary(&summary),
            |e: &crate::ports::StoreError| crate::ports::RetryIntent::is_retryable(e),
        )
        .await;""", "        let written = self.summaries.put_summary(&summary).await;"),
    ]),
    "late-claim": ("a delivery started after its lease lapsed claims the record all the same", [
        ("shared/src/lease/mod.rs", "    if fresh {", "    if fresh || !fresh {"),
    ]),
    "holder-settles": ("a duplicate's settling and the DLQ sweep fail a run a live lock holder is finishing", [
        ("shared/src/tasks/finish.rs", "                Settle::ByHolder => Ok(false),", """                Settle::ByHolder => {
                    let sent_before = message.sent_at_ms.saturating_add(crate::dlq::CLOCK_SKEW_MS);
                    self.store.fail_unfinished(&task.task_id, &reason, sent_before, now, ttl).await
                }"""),
        ("shared/src/dlq.rs", "if let Some(lock) = self.lock {", "if let Some(lock) = self.lock.filter(|_| false) {"),
    ]),
    "parked-marker": ("a parked run's delivery is acked on any batch marker of its task, an earlier run's too", [
        ("shared/src/tasks/batches.rs",
         "Ok(found) if found.get(&marker).map(|c| c.batch.as_str()) == parked_in => {",
         "Ok(found) if !found.is_empty() || parked_in.is_none() => {"),
    ]),
    "park-unknown": ("a park whose answer is lost is taken as not made, and the run called now", [
        ("shared/src/tasks/batches.rs",
         "Err(e) => Parking::Done(self.store_down(run, &e.to_string()).await),",
         "Err(_) => Parking::CallNow,"),
    ]),
    "lock-ask-thrice": ("a task worker runs without the lock after one failed ask, whose answer may have been lost", [
        ("shared/src/tasks/worker.rs",
         "lease::ask_thrice(|| self.lock.acquire(key, self.config.lease_ttl), |_| true).await",
         "self.lock.acquire(key, self.config.lease_ttl).await"),
    ]),
    "submitting-owner": ("a duplicate is acked on a batch record still submitting, which its worker may delete", [
        ("shared/src/domain/batch.rs",
         "        if self.phase != BatchPhase::Submitting {",
         "        if true || self.phase != BatchPhase::Submitting {"),
    ]),
}


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, **kw)


def main():
    histories = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    repo = Path.cwd()
    target = os.environ.get("LANES_REVERTS_TARGET", "/var/tmp/lanes-reverts-target")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        run(["git", "worktree", "add", "--detach", "-q", str(tree), "HEAD"])
        try:
            only = [n for n in os.environ.get("LANES_REVERTS_ONLY", "").split(",") if n]
            for name, (what, subs) in REVERTS.items():
                if only and name not in only:
                    continue
                run(["git", "checkout", "-q", "--", "."], cwd=tree)
                missing = []
                for path, new, old in subs:
                    p = tree / path
                    text = p.read_text()
                    if new not in text:
                        missing.append(path)
                        continue
                    p.write_text(text.replace(new, old, 1))
                if missing:
                    print(f"{name}: the fix's code changed in {', '.join(missing)}; update this revert", file=sys.stderr)
                    results.append({"fix": name, "what": what, "applied": False})
                    continue
                env = dict(os.environ, CARGO_TARGET_DIR=target, RUST_LOG="off")
                run(["cargo", "build", "-q", "--locked", "-p", "lanes-cli"], cwd=tree, env=env)
                out = subprocess.run([f"{target}/debug/lanes", "sim", "--seed", "1", "--histories", str(histories),
                                      "--stop-after", "1", "--json"], cwd=tree, env=env, text=True,
                                     capture_output=True).stdout
                s = json.loads(out)
                first = s["failures"][0] if s["failures"] else None
                row = {"fix": name, "what": what, "applied": True, "histories_run": s["histories"],
                       "found": first is not None,
                       "seed": first and first["seed"],
                       "invariants": sorted({v["invariant"] for v in first["violations"]}) if first else [],
                       "detail": first and first["violations"][0]["detail"]}
                print(json.dumps(row))
                results.append(row)
        finally:
            run(["git", "worktree", "remove", "--force", str(tree)])
    # A partial run (LANES_REVERTS_ONLY) replaces its rows and keeps the others.
    path = Path("bench/sim-reverts.json")
    only = [n for n in os.environ.get("LANES_REVERTS_ONLY", "").split(",") if n]
    if only and path.exists():
        kept = [r for r in json.loads(path.read_text())["reverts"] if r["fix"] not in only]
        results = kept + results
    results.sort(key=lambda r: list(REVERTS).index(r["fix"]) if r["fix"] in REVERTS else len(REVERTS))
    report = {"command": f"scripts/sim-reverts.py {histories}", "histories_per_revert": histories, "reverts": results}
    Path("bench/sim-reverts.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
