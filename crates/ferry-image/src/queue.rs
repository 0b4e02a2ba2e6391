//! The bytes of a TCP connection's queue ([`QueueBytes`]): owned when the
//! capture reads them, a range of the decoded metadata when a restore
//! decodes them from a shared buffer (meta.img's mapping): 10,000
//! connections' queues are 40 MB, and copying them into fresh memory
//! cost more than the rest of the decode.
//!
//! On the wire they are a postcard byte string (varint length, bytes),
//! exactly as `serde_bytes` wrote the `Vec<u8>` they were before.

use bytes::Bytes;
use std::cell::RefCell;

/// The bytes of one TCP queue. Reads as `[u8]`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct QueueBytes(Bytes);

impl QueueBytes {
    /// The bytes as a vector (a copy).
    pub fn to_vec(&self) -> Vec<u8> {
        self.0.to_vec()
    }
}

impl std::ops::Deref for QueueBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl From<Vec<u8>> for QueueBytes {
    fn from(v: Vec<u8>) -> Self {
        QueueBytes(Bytes::from(v))
    }
}

impl From<Bytes> for QueueBytes {
    fn from(b: Bytes) -> Self {
        QueueBytes(b)
    }
}

impl std::fmt::Debug for QueueBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0[..].fmt(f)
    }
}

impl PartialEq<Vec<u8>> for QueueBytes {
    fn eq(&self, other: &Vec<u8>) -> bool {
        self.0[..] == other[..]
    }
}

impl serde::Serialize for QueueBytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

thread_local! {
    /// The buffer being decoded on this thread, if it is shared
    /// ([`decoding_from`]): queue bytes inside it are taken as ranges.
    static SHARED: RefCell<Option<Bytes>> = const { RefCell::new(None) };
}

/// Runs `f` (a decode of bytes inside `shared`) with `shared` as the
/// buffer that queue bytes borrow from instead of being copied. Nested
/// calls and panics leave the previous buffer in place.
pub(crate) fn decoding_from<R>(shared: &Bytes, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Bytes>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let old = self.0.take();
            SHARED.with(|s| *s.borrow_mut() = old);
        }
    }
    let _restore = Restore(SHARED.with(|s| s.borrow_mut().replace(shared.clone())));
    f()
}

/// `v` as a range of the shared buffer when it lies inside it, else a copy.
fn from_borrowed(v: &[u8]) -> QueueBytes {
    let shared = SHARED.with(|s| {
        s.borrow().as_ref().and_then(|b| {
            let base = b.as_ptr() as usize;
            let at = (v.as_ptr() as usize).checked_sub(base)?;
            let end = at.checked_add(v.len())?;
            (end <= b.len()).then(|| b.slice(at..end))
        })
    });
    QueueBytes(shared.unwrap_or_else(|| Bytes::copy_from_slice(v)))
}

struct Visitor;

impl<'de> serde::de::Visitor<'de> for Visitor {
    type Value = QueueBytes;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a byte string")
    }
    fn visit_borrowed_bytes<E: serde::de::Error>(self, v: &'de [u8]) -> Result<QueueBytes, E> {
        Ok(from_borrowed(v))
    }
    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<QueueBytes, E> {
        Ok(QueueBytes(Bytes::copy_from_slice(v)))
    }
    fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<QueueBytes, E> {
        Ok(QueueBytes::from(v))
    }
    /// Self-describing formats (JSON) write bytes as a list of numbers.
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<QueueBytes, A::Error> {
        let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
        while let Some(b) = seq.next_element::<u8>()? {
            v.push(b);
        }
        Ok(QueueBytes::from(v))
    }
}

impl<'de> serde::Deserialize<'de> for QueueBytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_bytes(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_as_the_vec_it_replaced_and_borrows_only_inside_the_shared_buffer() {
        #[derive(serde::Serialize)]
        struct Old(#[serde(with = "serde_bytes")] Vec<u8>);
        let q = QueueBytes::from(vec![7u8; 300]);
        let wire = postcard::to_stdvec(&q).unwrap();
        assert_eq!(wire, postcard::to_stdvec(&Old(vec![7u8; 300])).unwrap());
        // Decoded from a shared buffer: a range of it, no copy.
        let shared = Bytes::from(wire.clone());
        let got: QueueBytes = decoding_from(&shared, || postcard::from_bytes(&shared).unwrap());
        assert_eq!(got, vec![7u8; 300]);
        assert_eq!(got.as_ptr(), shared[2..].as_ptr());
        // From other bytes (not the shared buffer): a copy.
        let other: QueueBytes = decoding_from(&shared, || postcard::from_bytes(&wire).unwrap());
        assert_eq!(other, vec![7u8; 300]);
        assert_ne!(other.as_ptr(), wire[2..].as_ptr());
        // The buffer is forgotten afterwards.
        let after: QueueBytes = postcard::from_bytes(&shared).unwrap();
        assert_ne!(after.as_ptr(), shared[2..].as_ptr());
    }

    #[test]
    fn json_reads_back_the_list_of_numbers_it_writes() {
        let q = QueueBytes::from(vec![1, 2, 255]);
        let s = serde_json::to_string(&q).unwrap();
        assert_eq!(s, "[1,2,255]");
        assert_eq!(serde_json::from_str::<QueueBytes>(&s).unwrap(), vec![1, 2, 255]);
    }
}
