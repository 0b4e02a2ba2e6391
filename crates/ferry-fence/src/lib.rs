//! Fencing for hot-standby replication: which host runs a service.
//!
//! The answer lives in etcd, in one owner record per service
//! (`/ferry/services/{service}/owner`, see [`record`]). A host runs the
//! service only after it won that record with a compare-and-swap:
//! [`Fence::claim_initial`] creates it (epoch 1) when absent, and
//! [`Fence::take_over`] replaces the record it last saw (epoch N) with its
//! own (epoch N + 1) only if nobody wrote it since. Of two hosts that race
//! for the same epoch exactly one wins; the other gets [`Claim::Lost`] with
//! the winner, and must not run the service.
//!
//! The API is blocking: each `Fence` drives the async etcd client on a
//! private current-thread runtime, and every operation, however many
//! requests it makes, ends within the timeout given to [`Fence::connect`]
//! (an unreachable etcd is an error naming the endpoints, never a hang).

mod conn;
mod error;
pub mod record;

pub use error::{FenceError, Site};
pub use record::Owner;

use conn::Conn;
use etcd_client::{Compare, CompareOp, KeyValue, Txn, TxnOp, TxnOpResponse, TxnResponse};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub type Result<T, E = FenceError> = std::result::Result<T, E>;

/// The outcome of a claim or a take-over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The caller owns the service under `epoch`.
    Won { epoch: u64 },
    /// Someone else does (or a newer epoch exists): the caller must not run
    /// the service.
    Lost { owner: Owner },
}

/// A connection to the etcd cluster that witnesses service ownership.
pub struct Fence {
    conn: Conn,
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence")
            .field("endpoints", &self.conn.joined)
            .field("timeout", &self.conn.timeout)
            .finish_non_exhaustive()
    }
}

/// An owner record as read, with the revision a compare-and-swap checks.
struct Stored {
    owner: Owner,
    mod_revision: i64,
}

impl Fence {
    /// Connects to the etcd cluster at `endpoints` (URLs such as
    /// `http://10.0.0.1:2379`) and checks that it answers. `timeout` bounds
    /// this and every later operation of the fence.
    pub fn connect(endpoints: &[String], timeout: Duration) -> Result<Fence> {
        let conn = Conn::new(endpoints, timeout)?;
        let deadline = Instant::now() + timeout;
        conn.call("connect", None, deadline, |mut c| async move { c.status().await })?;
        Ok(Fence { conn })
    }

    /// The endpoints, as errors name them.
    pub fn endpoints(&self) -> &str {
        &self.conn.joined
    }

    /// The bound of each operation.
    pub fn timeout(&self) -> Duration {
        self.conn.timeout
    }

    /// The current owner of `service`, None when nobody claimed it.
    pub fn owner(&self, service: &str) -> Result<Option<Owner>> {
        let key = self.key("owner", service)?;
        let deadline = Instant::now() + self.conn.timeout;
        Ok(self.read("owner", &key, deadline)?.map(|s| s.owner))
    }

    /// First claim of `service` by `holder`: creates the owner record with
    /// epoch 1 if there is none. When `holder` already owns it, it keeps
    /// its epoch (a restarted holder claims again); when another host does,
    /// the claim is lost.
    pub fn claim_initial(&self, service: &str, holder: &str) -> Result<Claim> {
        const OP: &str = "claim_initial";
        let key = self.key(OP, service)?;
        self.check_holder(OP, holder)?;
        let deadline = Instant::now() + self.conn.timeout;
        let mine =
            record::encode(&Owner { holder: holder.into(), epoch: 1, since_unix_ms: now_ms() });
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), mine, None)])
            .or_else([TxnOp::get(key.clone(), None)]);
        let resp = self.txn(OP, &key, deadline, txn)?;
        if resp.succeeded() {
            return Ok(Claim::Won { epoch: 1 });
        }
        match self.txn_get(OP, &key, &resp)? {
            Some(cur) if cur.owner.holder == holder => Ok(Claim::Won { epoch: cur.owner.epoch }),
            Some(cur) => Ok(Claim::Lost { owner: cur.owner }),
            None => Err(self.protocol(OP, &key, "the key exists and its read found nothing")),
        }
    }

    /// `holder` takes `service` over from the owner it saw at `seen_epoch`
    /// (a standby whose primary went silent, or a primary whose standby
    /// did): the record becomes `{holder, seen_epoch + 1}` if it is still
    /// the one stored at `seen_epoch`. If anyone wrote it since, the
    /// take-over is lost, whoever won.
    pub fn take_over(&self, service: &str, holder: &str, seen_epoch: u64) -> Result<Claim> {
        const OP: &str = "take_over";
        let key = self.key(OP, service)?;
        self.check_holder(OP, holder)?;
        let next = seen_epoch
            .checked_add(1)
            .ok_or_else(|| FenceError::Usage(format!("epoch {seen_epoch} has no successor")))?;
        let deadline = Instant::now() + self.conn.timeout;
        let Some(cur) = self.read(OP, &key, deadline)? else {
            return Err(FenceError::NotClaimed { site: self.site(OP, &key) });
        };
        if cur.owner.epoch != seen_epoch {
            // Our own take-over of seen_epoch whose answer we did not get
            // (timeout) is already done: retrying it must not lose.
            if cur.owner.holder == holder && cur.owner.epoch == next {
                return Ok(Claim::Won { epoch: next });
            }
            return Ok(Claim::Lost { owner: cur.owner });
        }
        let mine =
            record::encode(&Owner { holder: holder.into(), epoch: next, since_unix_ms: now_ms() });
        let txn = Txn::new()
            .when([Compare::mod_revision(key.clone(), CompareOp::Equal, cur.mod_revision)])
            .and_then([TxnOp::put(key.clone(), mine, None)])
            .or_else([TxnOp::get(key.clone(), None)]);
        let resp = self.txn(OP, &key, deadline, txn)?;
        if resp.succeeded() {
            return Ok(Claim::Won { epoch: next });
        }
        match self.txn_get(OP, &key, &resp)? {
            // A transaction retried on another endpoint after its first
            // run went through finds its own write.
            Some(cur) if cur.owner.holder == holder && cur.owner.epoch == next => {
                Ok(Claim::Won { epoch: next })
            }
            Some(cur) => Ok(Claim::Lost { owner: cur.owner }),
            None => Err(FenceError::NotClaimed { site: self.site(OP, &key) }),
        }
    }

    /// Removes the owner record if `holder` still owns `service` under
    /// `epoch`; false (record untouched) otherwise. With several
    /// endpoints, a delete that went through on one that then failed to
    /// answer, retried on the next, is false too (the record is gone).
    pub fn release(&self, service: &str, holder: &str, epoch: u64) -> Result<bool> {
        const OP: &str = "release";
        let key = self.key(OP, service)?;
        let deadline = Instant::now() + self.conn.timeout;
        let cur = match self.read(OP, &key, deadline)? {
            Some(cur) if cur.owner.holder == holder && cur.owner.epoch == epoch => cur,
            _ => return Ok(false),
        };
        let txn = Txn::new()
            .when([Compare::mod_revision(key.clone(), CompareOp::Equal, cur.mod_revision)])
            .and_then([TxnOp::delete(key.clone(), None)]);
        Ok(self.txn(OP, &key, deadline, txn)?.succeeded())
    }

    fn key(&self, op: &'static str, service: &str) -> Result<String> {
        record::owner_key(service)
            .map_err(|e| FenceError::Usage(format!("{op}: service name {service:?}: {e}")))
    }

    fn check_holder(&self, op: &'static str, holder: &str) -> Result<()> {
        record::check_holder(holder)
            .map_err(|e| FenceError::Usage(format!("{op}: holder {holder:?}: {e}")))
    }

    fn site(&self, op: &'static str, key: &str) -> Site {
        self.conn.site(op, Some(key))
    }

    fn protocol(&self, op: &'static str, key: &str, what: &str) -> FenceError {
        FenceError::Protocol { site: self.site(op, key), what: what.into() }
    }

    fn txn(&self, op: &'static str, key: &str, deadline: Instant, txn: Txn) -> Result<TxnResponse> {
        self.conn.call(op, Some(key), deadline, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
    }

    fn read(&self, op: &'static str, key: &str, deadline: Instant) -> Result<Option<Stored>> {
        let resp = self.conn.call(op, Some(key), deadline, |mut c| {
            let k = key.to_string();
            async move { c.get(k, None).await }
        })?;
        resp.kvs().first().map(|kv| self.stored(op, key, kv)).transpose()
    }

    /// The record read by the `or_else` get of a transaction that failed.
    fn txn_get(&self, op: &'static str, key: &str, resp: &TxnResponse) -> Result<Option<Stored>> {
        match resp.op_responses().into_iter().next() {
            Some(TxnOpResponse::Get(get)) => {
                get.kvs().first().map(|kv| self.stored(op, key, kv)).transpose()
            }
            _ => Err(self.protocol(op, key, "the failed transaction returned no read")),
        }
    }

    fn stored(&self, op: &'static str, key: &str, kv: &KeyValue) -> Result<Stored> {
        let owner = record::decode(kv.value())
            .map_err(|reason| FenceError::BadRecord { site: self.site(op, key), reason })?;
        Ok(Stored { owner, mod_revision: kv.mod_revision() })
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
