//! The soft deadline's timer: a running statement moves, slot and all, to its workload's
//! `demote_to` when it outlives `demote_after` ([`demote_when_due`]); the lanes it learns are
//! [`crate::lanes`]'s. It reads the server's state (where the statement is, the catalog), so it
//! sits above it.

use std::sync::Arc;

use crate::state::Shared;

/// Demotes query `query_id`, admitted at `since`, each time it outlives the `demote_after` of
/// the workload it is in (its deadline counts from admission, so a chain of lanes reads as
/// total run times). Returns when the workload it reached demotes no further; dropped (the
/// query ended) it does nothing more. Rereads the catalog at each deadline, so a changed
/// setting applies to queries already running.
pub async fn demote_when_due(shared: Arc<Shared>, query_id: u64, since: tokio::time::Instant) {
    loop {
        let Some(workload) = shared.registry.workload_of_query(query_id) else {
            return;
        };
        let Some(due) = shared.snapshot().catalog.lanes(&workload).demotion else {
            return;
        };
        tokio::time::sleep_until(since + due.after).await;
        let now = shared.registry.workload_of_query(query_id);
        let still = now
            .as_deref()
            .and_then(|w| shared.snapshot().catalog.lanes(w).demotion);
        if now.as_deref() != Some(workload.as_str()) || still.as_ref() != Some(&due) {
            continue; // moved, or the settings changed while it slept: look again
        }
        if let Err(e) = shared.demote(query_id, &due.to) {
            tracing::warn!(query_id, "could not demote to '{}': {e}", due.to);
            return;
        }
    }
}

/// Aborts its task when dropped: a query's demotion timer ends with the query.
#[derive(Debug)]
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod demotion_tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use sluice_sched::Machine;

    use crate::state::{Attachment, Grant, Shared};
    use crate::ServerOptions;

    /// A statement admitted in `workload` the way `Admission::admit` admits one.
    fn admit(
        shared: &Arc<Shared>,
        workload: &str,
    ) -> (crate::registry::ProcessGuard, Arc<Mutex<Grant>>) {
        let guard = shared.registry.register(
            &Arc::from("u"),
            &Arc::from(workload),
            &Arc::from("SELECT slow_report()"),
            None,
            std::time::Instant::now(),
            None,
        );
        let snapshot = shared.snapshot();
        let mut attachments = Vec::new();
        for (resource, scheduler) in &snapshot.schedulers {
            let mut acquire = scheduler.acquire(workload, 1).expect("queues");
            assert!(acquire.is_granted(), "{workload} has a free slot");
            let permit = futures::executor::block_on(&mut acquire).expect("granted");
            attachments.push(Attachment {
                resource: Arc::from(resource.as_str()),
                permit,
                in_flight: shared
                    .metrics
                    .series(resource, workload)
                    .admitted(Duration::ZERO),
                logged: None,
                cpu_slot: None,
            });
        }
        let grant = Arc::new(Mutex::new(Grant {
            workload: workload.into(),
            attachments,
            memory: None,
            demoted: None,
        }));
        guard.running(grant.clone());
        (guard, grant)
    }

    /// The requests `workload`'s concurrency limit holds.
    fn inflight(shared: &Shared, workload: &str) -> i64 {
        let snapshot = shared.snapshot();
        snapshot
            .schedulers
            .values()
            .flat_map(|s| s.nodes())
            .find(|n| n.type_name == "inflight_limit" && n.path.contains(&format!("/{workload}/")))
            .and_then(|n| n.inflight_requests)
            .unwrap_or(-1)
    }

    #[tokio::test(start_paused = true)]
    async fn a_running_query_moves_at_its_deadline_and_counts_in_the_slow_lane_after() {
        let dir = tempfile::tempdir().expect("tempdir");
        let shared = Shared::open(ServerOptions::new(
            dir.path(),
            Machine {
                cores: 4,
                memory: 1 << 34,
            },
        ))
        .expect("opens");
        for ddl in [
            "CREATE RESOURCE q (QUERY)",
            "CREATE WORKLOAD all",
            "CREATE WORKLOAD slow IN all SETTINGS max_concurrent_queries = 1",
            "CREATE WORKLOAD fast IN all SETTINGS max_concurrent_queries = 1, demote_after = '20s', demote_to = 'slow'",
        ] {
            shared
                .apply_ddl(&sluice_sql::parse_statement(ddl).expect("parses"))
                .await
                .expect("applies");
        }
        // One runs in slow already; the report starts in fast.
        let (_slow_one, _) = admit(&shared, "slow");
        let (report, grant) = admit(&shared, "fast");
        let timer = tokio::spawn(super::demote_when_due(
            shared.clone(),
            report.query_id,
            tokio::time::Instant::now(),
        ));
        tokio::time::sleep(Duration::from_millis(19_999)).await;
        assert_eq!(
            shared
                .registry
                .workload_of_query(report.query_id)
                .as_deref(),
            Some("fast")
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
        tokio::task::yield_now().await;
        // Moved at the deadline, with its slot: fast is free, slow is over its limit of 1.
        assert_eq!(
            shared
                .registry
                .workload_of_query(report.query_id)
                .as_deref(),
            Some("slow")
        );
        assert_eq!(
            grant
                .lock()
                .expect("grant")
                .demoted
                .as_ref()
                .map(|(f, _)| f.as_str()),
            Some("fast")
        );
        assert_eq!(inflight(&shared, "slow"), 2);
        assert_eq!(inflight(&shared, "fast"), 0);
        timer
            .await
            .expect("the timer ends: slow demotes no further");
        // New admissions in slow wait until it is back under its limit; fast admits at once.
        let snapshot = shared.snapshot();
        let scheduler = snapshot.schedulers.values().next().expect("q");
        assert!(!scheduler.acquire("slow", 1).expect("queues").is_granted());
        assert!(scheduler.acquire("fast", 1).expect("queues").is_granted());
        // Learned: the next run of the statement goes straight to slow.
        let fingerprint = sluice_sql::fingerprint("SELECT slow_report()");
        assert_eq!(
            shared.lanes.lane(&fingerprint.id),
            Some(("slow".to_string(), false))
        );
    }
}
