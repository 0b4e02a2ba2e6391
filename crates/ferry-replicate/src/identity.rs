//! Names in the fencing store: a service is named by its address (one
//! address, one service), an agent by its host and network namespace, so
//! that `ferry replicate` and the ferryd of one test host or machine are
//! the same holder.

use std::net::IpAddr;

/// The service's name: its address, with ':' made safe for a key path.
pub fn service_name(address: IpAddr) -> String {
    format!("addr-{}", address.to_string().replace(':', "_"))
}

/// This agent's name: the host name and the network namespace's inode.
pub fn holder() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let netns = std::fs::read_link("/proc/self/ns/net")
        .ok()
        .and_then(|l| {
            l.to_string_lossy()
                .strip_prefix("net:[")
                .and_then(|r| r.strip_suffix(']'))
                .map(str::to_string)
        })
        .unwrap_or_else(|| "0".into());
    format!("{host}/net-{netns}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_are_key_safe() {
        assert_eq!(service_name("10.0.0.5".parse().unwrap()), "addr-10.0.0.5");
        assert_eq!(service_name("fd00::5".parse().unwrap()), "addr-fd00__5");
    }

    #[test]
    fn holder_names_host_and_namespace() {
        let h = holder();
        assert!(h.contains("/net-"), "{h}");
        assert_eq!(h, holder(), "stable within one namespace");
    }
}
