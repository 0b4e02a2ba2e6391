//! Requests to an etcd cluster of one or more endpoints, each bounded by
//! the deadline of the fence operation it belongs to.

use crate::error::{describe, FenceError, Site};
use etcd_client::{Client, ConnectOptions};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// One client per endpoint: etcd-client's own balancing sends a request
/// to a dead member and fails it, where trying the next member would do.
pub(crate) struct Conn {
    rt: tokio::runtime::Runtime,
    clients: Vec<(String, Client)>,
    /// The endpoint that answered last: tried first.
    preferred: AtomicUsize,
    pub(crate) joined: String,
    pub(crate) timeout: Duration,
}

impl Conn {
    /// Clients for `endpoints` (no request yet: the first one connects).
    pub(crate) fn new(endpoints: &[String], timeout: Duration) -> Result<Conn, FenceError> {
        if endpoints.is_empty() {
            return Err(FenceError::Usage("no etcd endpoint given".into()));
        }
        if timeout.is_zero() {
            return Err(FenceError::Usage("the timeout must be above zero".into()));
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(FenceError::Runtime)?;
        let joined = endpoints.join(",");
        // No request timeout of the client's own: the fence's deadline
        // covers whole operations. Keep-alive pings find a connection to
        // a frozen or vanished etcd dead, so that a later request
        // connects anew.
        let options =
            ConnectOptions::new().with_connect_timeout(timeout).with_keep_alive(timeout, timeout);
        let mut clients = Vec::with_capacity(endpoints.len());
        for ep in endpoints {
            let made = rt.block_on(Client::connect([ep.as_str()], Some(options.clone())));
            let client = made.map_err(|e| FenceError::Etcd {
                site: Site { endpoints: joined.clone(), op: "connect", key: None },
                detail: format!("{ep}: {}", describe(&e)),
            })?;
            clients.push((ep.clone(), client));
        }
        Ok(Conn { rt, clients, preferred: AtomicUsize::new(0), joined, timeout })
    }

    pub(crate) fn site(&self, op: &'static str, key: Option<&str>) -> Site {
        Site { endpoints: self.joined.clone(), op, key: key.map(str::to_string) }
    }

    /// Runs `call` against one endpoint after the other, starting with
    /// the one that answered last, until one answers or `deadline`
    /// passes. Each endpoint gets an equal share of the time left, the
    /// last one all of it. Every request a fence operation retries is
    /// safe to repeat (reads, or transactions whose compare fails on a
    /// second run and whose caller then reads the outcome).
    pub(crate) fn call<T, F, Fut>(
        &self,
        op: &'static str,
        key: Option<&str>,
        deadline: Instant,
        call: F,
    ) -> Result<T, FenceError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let n = self.clients.len();
        let first = self.preferred.load(Ordering::Relaxed) % n;
        // (endpoint, its error; None when it did not answer in time)
        let mut failures: Vec<(&str, Option<String>)> = Vec::new();
        for k in 0..n {
            let i = (first + k) % n;
            let (endpoint, client) = &self.clients[i];
            let until = attempt_deadline(Instant::now(), deadline, n - k);
            let fut = call(client.clone());
            let result = self.rt.block_on(async {
                tokio::time::timeout_at(tokio::time::Instant::from_std(until), fut).await
            });
            match result {
                Ok(Ok(v)) => {
                    self.preferred.store(i, Ordering::Relaxed);
                    return Ok(v);
                }
                Ok(Err(e)) => failures.push((endpoint, Some(describe(&e)))),
                Err(_) => failures.push((endpoint, None)),
            }
            if Instant::now() >= deadline {
                break;
            }
        }
        let site = self.site(op, key);
        if failures.iter().all(|(_, e)| e.is_none()) {
            return Err(FenceError::Timeout { site, timeout: self.timeout });
        }
        let detail = match failures.as_slice() {
            [(_, Some(e))] => e.clone(),
            _ => failures
                .iter()
                .map(|(ep, e)| format!("{ep}: {}", e.as_deref().unwrap_or("no answer")))
                .collect::<Vec<_>>()
                .join("; "),
        };
        Err(FenceError::Etcd { site, detail })
    }
}

/// When the attempt on one of `endpoints_left` endpoints must end: an
/// equal share of the time left, so a frozen member does not eat the
/// time of the ones after it.
fn attempt_deadline(now: Instant, deadline: Instant, endpoints_left: usize) -> Instant {
    let left = deadline.saturating_duration_since(now);
    now + left / endpoints_left.max(1) as u32
}

#[cfg(test)]
mod tests {
    use super::attempt_deadline;
    use std::time::{Duration, Instant};

    #[test]
    fn each_endpoint_gets_a_share_of_the_time_left() {
        let now = Instant::now();
        let deadline = now + Duration::from_millis(900);
        assert_eq!(attempt_deadline(now, deadline, 3), now + Duration::from_millis(300));
        assert_eq!(attempt_deadline(now, deadline, 1), deadline);
        assert_eq!(attempt_deadline(now, deadline, 0), deadline);
        // Past the deadline: no time at all.
        assert_eq!(attempt_deadline(deadline, now, 2), deadline);
    }
}
