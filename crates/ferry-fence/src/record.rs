//! The owner record of a service: where it lives in etcd and how its value
//! is written and read. Pure code, no etcd: the value read back is treated
//! as hostile input (anyone with access to the etcd cluster can write it).

use serde::{Deserialize, Serialize};

/// Every owner key starts with this; the service name follows, then `/owner`.
pub const KEY_PREFIX: &str = "/ferry/services/";

/// Larger values are refused before parsing: a real record is under 200
/// bytes, and a huge value is not worth a parse.
pub const MAX_VALUE_LEN: usize = 4096;

const MAX_SERVICE_LEN: usize = 128;
const MAX_HOLDER_LEN: usize = 256;

/// Who runs a service, since when, under which epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Owner {
    /// The host (or agent) that runs the service.
    pub holder: String,
    /// Starts at 1 with the first claim; each take-over adds 1. A holder
    /// acts only while the stored epoch is the one it won.
    pub epoch: u64,
    /// When this holder won the epoch (wall clock of the winner).
    pub since_unix_ms: u64,
}

/// The etcd key of `service`'s owner record. The name becomes one path
/// component, so it may not hold a '/' (or be "." or ".."): a name that
/// reached into another service's keys would fence the wrong service.
pub fn owner_key(service: &str) -> Result<String, String> {
    check_service(service)?;
    Ok(format!("{KEY_PREFIX}{service}/owner"))
}

fn check_service(service: &str) -> Result<(), String> {
    if service.is_empty() || service.len() > MAX_SERVICE_LEN {
        return Err(format!("a service name has 1 to {MAX_SERVICE_LEN} bytes"));
    }
    if service == "." || service == ".." {
        return Err("a service name is not \".\" or \"..\"".into());
    }
    match service.chars().find(|c| !(c.is_ascii_alphanumeric() || "._-".contains(*c))) {
        Some(c) => Err(format!("{c:?} is not allowed (letters, digits, '.', '_', '-')")),
        None => Ok(()),
    }
}

/// A holder names a host: printable, 1 to 256 bytes.
pub fn check_holder(holder: &str) -> Result<(), String> {
    if holder.is_empty() || holder.len() > MAX_HOLDER_LEN {
        return Err(format!("a holder name has 1 to {MAX_HOLDER_LEN} bytes"));
    }
    match holder.chars().find(|c| c.is_control()) {
        Some(c) => Err(format!("control character {c:?} in a holder name")),
        None => Ok(()),
    }
}

/// The value stored for `owner` (JSON).
pub fn encode(owner: &Owner) -> Vec<u8> {
    // Serializing a struct of a string and two integers cannot fail.
    serde_json::to_vec(owner).unwrap_or_default()
}

/// Reads a stored value back, checking what the fence relies on: valid
/// JSON with exactly the three fields, an epoch of at least 1 and a valid
/// holder. The error says what is wrong, for an error naming the key.
pub fn decode(value: &[u8]) -> Result<Owner, String> {
    if value.len() > MAX_VALUE_LEN {
        return Err(format!(
            "{} bytes, more than the {MAX_VALUE_LEN} a record may have",
            value.len()
        ));
    }
    // serde would also read the fields from an array: the format is an object.
    if value.trim_ascii_start().first() != Some(&b'{') {
        return Err("not an owner record: not a JSON object".into());
    }
    let owner: Owner =
        serde_json::from_slice(value).map_err(|e| format!("not an owner record: {e}"))?;
    if owner.epoch == 0 {
        return Err("epoch 0 (epochs start at 1)".into());
    }
    check_holder(&owner.holder).map_err(|e| format!("holder {:?}: {e}", owner.holder))?;
    Ok(owner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(holder: &str, epoch: u64) -> Owner {
        Owner { holder: holder.into(), epoch, since_unix_ms: 1_700_000_000_123 }
    }

    #[test]
    fn a_record_round_trips() {
        let o = owner("host-a", 7);
        assert_eq!(decode(&encode(&o)), Ok(o));
    }

    #[test]
    fn the_value_is_the_documented_json() {
        let text = String::from_utf8(encode(&owner("a", 1))).unwrap();
        assert_eq!(text, r#"{"holder":"a","epoch":1,"since_unix_ms":1700000000123}"#);
    }

    #[test]
    fn bad_values_are_errors_that_say_why() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "not an owner record"),
            (b"\xff\xfe", "not an owner record"),
            (b"{\"holder\":\"a\",\"epoch\":1}", "missing field `since_unix_ms`"),
            (b"{\"holder\":\"a\",\"epoch\":-1,\"since_unix_ms\":0}", "not an owner record"),
            (b"{\"holder\":\"a\",\"epoch\":1e3,\"since_unix_ms\":0}", "not an owner record"),
            (b"{\"holder\":\"a\",\"epoch\":0,\"since_unix_ms\":0}", "epoch 0"),
            (b"{\"holder\":\"\",\"epoch\":1,\"since_unix_ms\":0}", "holder \"\""),
            (b"{\"holder\":\"a\\n\",\"epoch\":1,\"since_unix_ms\":0}", "control character"),
            (b"{\"holder\":\"a\",\"epoch\":1,\"since_unix_ms\":0,\"x\":1}", "unknown field `x`"),
            (b"[\"a\",1,0]", "not an owner record"),
            (b"{\"holder\":\"a\",\"epoch\":18446744073709551616,\"since_unix_ms\":0}", "not an"),
        ];
        for (value, want) in cases {
            let err = decode(value).expect_err(&String::from_utf8_lossy(value));
            assert!(err.contains(want), "{:?}: {err}", String::from_utf8_lossy(value));
        }
    }

    #[test]
    fn a_huge_value_is_refused_before_parsing() {
        let mut v = b"{\"holder\":\"".to_vec();
        v.resize(MAX_VALUE_LEN + 1, b'a');
        assert!(decode(&v).unwrap_err().contains("more than the 4096"));
        // Deeply nested JSON within the limit is a parse error, not a stack overflow.
        let nested = "[".repeat(MAX_VALUE_LEN);
        assert!(decode(nested.as_bytes()).unwrap_err().contains("not an owner record"));
    }

    #[test]
    fn service_names_stay_one_key_component() {
        assert_eq!(owner_key("redis-1.prod_a").unwrap(), "/ferry/services/redis-1.prod_a/owner");
        for bad in ["", ".", "..", "a/b", "../x", "a b", "é", "a\0", &"x".repeat(129)] {
            assert!(owner_key(bad).is_err(), "{bad:?} accepted");
        }
        assert!(owner_key(&"x".repeat(128)).is_ok());
    }

    #[test]
    fn holder_names_are_printable() {
        assert!(check_holder("standby 10.0.0.2").is_ok());
        assert!(check_holder("").is_err());
        assert!(check_holder("a\tb").is_err());
        assert!(check_holder(&"h".repeat(257)).is_err());
    }
}
