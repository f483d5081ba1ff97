//! A new adapter for a port, checked with the testkit's contract suite.
//!
//! `VecAuditLog` keeps the audit log (the `AuditLog` port) in a
//! `Mutex<Vec<_>>`. `main` runs every case of the port's contract suite,
//! `parlance_testkit::audit`, on a fresh log each; in an adapter crate's
//! tests the same suite is one line, `parlance_testkit::audit_log_suite!`,
//! which expands to one `#[tokio::test]` per case (as in the `contract`
//! module below, run by `cargo test -p parlance-examples --example
//! custom_adapter`). Run with
//! `cargo run -p parlance-examples --example custom_adapter`.

#![allow(clippy::print_stdout)] // an example prints what it shows

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use parlance_core::{EntityKind, ProductId};
use parlance_ports::{AuditEntry, AuditLog, AuditRecord, PortResult};
use parlance_testkit::audit;

/// An audit log in memory: records in append order, `seq` counting from 1.
#[derive(Debug, Default)]
pub struct VecAuditLog {
    records: Mutex<Vec<AuditRecord>>,
}

#[async_trait]
impl AuditLog for VecAuditLog {
    async fn append(&self, entries: &[AuditEntry]) -> PortResult<()> {
        // One lock for the whole batch: the entries land together, in order.
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        for entry in entries {
            let seq = records.len() as i64 + 1;
            records.push(AuditRecord {
                seq,
                entry: entry.clone(),
            });
        }
        Ok(())
    }

    async fn list(
        &self,
        product_id: &ProductId,
        entity_kind: EntityKind,
        entity_id: &str,
        after_seq: Option<i64>,
        limit: usize,
    ) -> PortResult<Vec<AuditRecord>> {
        let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        Ok(records
            .iter()
            .filter(|r| {
                r.entry.product_id == *product_id
                    && r.entry.entity_kind == entity_kind
                    && r.entry.entity_id == entity_id
                    && after_seq.is_none_or(|after| r.seq > after)
            })
            .take(limit)
            .cloned()
            .collect())
    }
}

fn subject() -> audit::Subject {
    Arc::new(VecAuditLog::default())
}

#[tokio::main]
async fn main() {
    // The suite's cases, as `audit_log_suite!` lists them.
    audit::append_then_list_in_order(subject()).await;
    println!("ok: append_then_list_in_order");
    audit::list_is_scoped_by_product_kind_and_entity(subject()).await;
    println!("ok: list_is_scoped_by_product_kind_and_entity");
    audit::list_pages_after_seq(subject()).await;
    println!("ok: list_pages_after_seq");
    audit::values_round_trip_exactly(subject()).await;
    println!("ok: values_round_trip_exactly");
    audit::concurrent_appends_lose_nothing(subject()).await;
    println!("ok: concurrent_appends_lose_nothing");
    println!("VecAuditLog passes the audit log contract suite (5 cases)");
}

/// The contract suite as an adapter crate runs it: one test per case.
#[cfg(test)]
mod contract {
    parlance_testkit::audit_log_suite!(async { Some(super::subject()) });
}
