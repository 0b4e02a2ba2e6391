//! The demo's report: one row per migration, read from the JSON that
//! `ferry migrate --report` writes, and the clients' totals.

use super::load::Summary;
use anyhow::{anyhow, Context, Result};
use serde_json::Value;
use std::path::Path;

/// One migration, as its report tells it.
pub struct Migration {
    pub from: String,
    pub to: String,
    /// The root's PID at the destination, as that host sees it.
    pub dest_host_pid: i32,
    /// From the first thread seized at the source to the tree running at
    /// the destination.
    pub pause_ms: f64,
    /// Parts of the pause, from the source's phases: freeze and capture
    /// (the last pages included), taking the address off, sending the
    /// image, the destination's restore (until it reports the tree ready,
    /// held), and its release (Commit → Running: lock down, address
    /// announced).
    pub capture_ms: f64,
    pub address_ms: f64,
    pub send_ms: f64,
    pub restore_ms: f64,
    pub release_ms: f64,
    pub total_ms: f64,
    pub bytes_sent: u64,
    /// Page bytes sent while the tree was frozen.
    pub final_page_bytes: u64,
    pub rounds: usize,
    /// The longest request a client saw during this migration, by its own
    /// clock (set by the demo, not in the report).
    pub client_max_ms: f64,
}

fn phase(v: &Value, list: &str, name: &str) -> f64 {
    v[list]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p[0].as_str() == Some(name))
        .filter_map(|p| p[1].as_f64())
        .sum()
}

impl Migration {
    pub fn read(path: &Path, from: &str, to: &str) -> Result<Migration> {
        let text = std::fs::read(path)
            .with_context(|| format!("reading the migration report {}", path.display()))?;
        let v: Value =
            serde_json::from_slice(&text).with_context(|| format!("parsing {}", path.display()))?;
        let dest_host_pid = v["dest_host_pid"]
            .as_i64()
            .ok_or_else(|| anyhow!("{}: no dest_host_pid", path.display()))?
            as i32;
        Ok(Migration {
            from: from.to_string(),
            to: to.to_string(),
            dest_host_pid,
            pause_ms: v["pause_ms"].as_f64().unwrap_or(0.0),
            // "freeze+capture" runs from the previous step's end and so
            // includes preparing the network lock, which happens before
            // the first thread is seized.
            capture_ms: (phase(&v, "source_phases", "freeze+capture")
                - phase(&v, "source_phases", "capture: network lock prepared"))
            .max(0.0),
            address_ms: phase(&v, "source_phases", "address off"),
            send_ms: phase(&v, "source_phases", "image sent"),
            restore_ms: phase(&v, "source_phases", "destination restore"),
            release_ms: phase(&v, "source_phases", "destination release"),
            total_ms: v["total_ms"].as_f64().unwrap_or(0.0),
            bytes_sent: v["bytes_sent"].as_u64().unwrap_or(0),
            final_page_bytes: v["final_page_bytes"].as_u64().unwrap_or(0),
            rounds: v["rounds"].as_array().map_or(0, Vec::len),
            client_max_ms: 0.0,
        })
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / 1048576.0)
}

/// The table of migrations and the clients' line, as text.
pub fn render(migrations: &[Migration], load: &Summary) -> String {
    let mut s = String::new();
    if !migrations.is_empty() {
        s.push_str(&format!(
            "  {:<18} {:>8} {:>8} | {:>8} {:>8} {:>8} {:>8} {:>8} | {:>9} {:>10} {:>6} {:>9}\n",
            "migration",
            "pause",
            "client",
            "capture",
            "addr off",
            "send",
            "restore",
            "release",
            "sent",
            "in pause",
            "rounds",
            "total"
        ));
        for (i, m) in migrations.iter().enumerate() {
            s.push_str(&format!(
                "  {:<18} {:>5.1} ms {:>5.1} ms | {:>5.1} ms {:>5.1} ms {:>5.1} ms {:>5.1} ms {:>5.1} ms | {:>9} {:>10} {:>6} {:>6.0} ms\n",
                format!("{} {} → {}", i + 1, m.from, m.to),
                m.pause_ms,
                m.client_max_ms,
                m.capture_ms,
                m.address_ms,
                m.send_ms,
                m.restore_ms,
                m.release_ms,
                mib(m.bytes_sent),
                mib(m.final_page_bytes),
                m.rounds,
                m.total_ms
            ));
        }
        s.push_str(
            "  (pause: the service frozen, from the first thread seized to running at the destination; client: the longest request\n   \
             a client saw during the migration, by its own clock; the pause's parts: capture at the source,\n   \
             service address off, image sent, restore at the destination, release there (lock down, address announced).\n   \
             sent: all bytes on the wire, pre-copy included; in pause: the pages sent while frozen.)\n",
        );
    }
    s.push_str(&format!(
        "  clients: {} connections, {} requests done, {} failed, {} reconnects, longest request {:.1} ms; {}/{} counters match\n",
        load.clients, load.done, load.failed, load.reconnects, load.max_latency_ms, load.counters_ok, load.clients
    ));
    if let Some(e) = &load.first_error {
        s.push_str(&format!("  first client error: {e}\n"));
    }
    s
}
