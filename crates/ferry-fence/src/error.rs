use std::fmt;
use std::time::Duration;

/// Where a fence operation failed: the etcd endpoints it used, the
/// operation and the owner key (none for `connect`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    pub endpoints: String,
    pub op: &'static str,
    pub key: Option<String>,
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "etcd at {}: {}", self.endpoints, self.op)?;
        match &self.key {
            Some(key) => write!(f, " {key}"),
            None => Ok(()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// A bad argument (service or holder name, endpoint list, epoch).
    #[error("fence: {0}")]
    Usage(String),
    #[error("fence: starting its runtime: {0}")]
    Runtime(std::io::Error),
    /// etcd did not answer in time: down, paused, or unreachable.
    #[error("{site}: no answer within {} ms (etcd down or unreachable)", .timeout.as_millis())]
    Timeout { site: Site, timeout: Duration },
    /// etcd (or the connection to it) answered with an error.
    #[error("{site}: {detail}")]
    Etcd { site: Site, detail: String },
    /// The owner key holds something that is not an owner record.
    #[error("{site}: the stored value is not a valid owner record: {reason}")]
    BadRecord { site: Site, reason: String },
    /// take_over found no owner record to take over from.
    #[error("{site}: no owner record (never claimed, or released): claim_initial makes one")]
    NotClaimed { site: Site },
    /// etcd's answer lacks what the request must return.
    #[error("{site}: unexpected answer: {what}")]
    Protocol { site: Site, what: String },
}

/// One line for an etcd client error, with its causes (tonic nests the
/// useful part, e.g. "Connection refused", a few sources deep).
pub(crate) fn describe(e: &etcd_client::Error) -> String {
    use std::error::Error as _;
    // etcd_client::Error has no source(); the variants that wrap one do.
    let (mut text, mut cause) = match e {
        etcd_client::Error::GRpcStatus(s) => {
            (format!("{:?}: {}", s.code(), s.message()), s.source())
        }
        etcd_client::Error::TransportError(t) => (e.to_string(), t.source()),
        etcd_client::Error::IoError(io) => (e.to_string(), io.source()),
        other => (other.to_string(), None),
    };
    while let Some(c) = cause {
        let s = c.to_string();
        if !text.contains(&s) {
            text.push_str(": ");
            text.push_str(&s);
        }
        cause = c.source();
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_endpoints_the_operation_and_the_key() {
        let site = Site {
            endpoints: "http://10.0.0.1:2379".into(),
            op: "take_over",
            key: Some("/ferry/services/redis/owner".into()),
        };
        let e = FenceError::Timeout { site: site.clone(), timeout: Duration::from_millis(1500) };
        assert_eq!(
            e.to_string(),
            "etcd at http://10.0.0.1:2379: take_over /ferry/services/redis/owner: \
             no answer within 1500 ms (etcd down or unreachable)"
        );
        let e = FenceError::BadRecord { site, reason: "epoch 0".into() };
        assert!(e
            .to_string()
            .ends_with("owner: the stored value is not a valid owner record: epoch 0"));
        let connect = Site { endpoints: "http://a:1".into(), op: "connect", key: None };
        assert_eq!(connect.to_string(), "etcd at http://a:1: connect");
    }

    #[test]
    fn client_errors_are_one_line() {
        let e =
            etcd_client::Error::EndpointError("tcp connect error:\n   Connection refused".into());
        let text = describe(&e);
        assert!(!text.contains('\n'), "{text}");
        assert!(text.ends_with("tcp connect error: Connection refused"), "{text}");
    }
}
