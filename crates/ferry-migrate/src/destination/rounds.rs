//! Pages into the page store, pre-copy round after round and then the
//! freeze's final pages, until the image arrives.

use crate::error::{MigrateError, Result};
use crate::page_store::PageStore;
use crate::protocol::{self, Hello, Msg};
use ferry_transport::Channel;

/// The image as it came: its encoded metadata and the source's PIDs of
/// its processes.
pub struct ImageReceived {
    pub meta: Vec<u8>,
    pub host_pids: Vec<i32>,
}

pub(super) fn page_store(hello: &Hello) -> Result<PageStore> {
    let mut store = PageStore::new()?;
    if !hello.lazy {
        store.place_pages_of(hello.root_pid);
    }
    Ok(store)
}

/// Stores every page that arrives and answers each round with
/// RoundStored (`stored` hears of it), until the image.
pub(super) fn receive(
    ch: &mut Channel,
    store: &mut PageStore,
    mut stored: impl FnMut(u32),
) -> Result<ImageReceived> {
    loop {
        let r = protocol::recv(ch)?;
        match r.msg {
            Msg::Pages { pid, ref ranges } => store.insert(pid, ranges, r.data())?,
            Msg::RoundDone { round, .. } => {
                protocol::send(ch, &Msg::RoundStored { round })?;
                stored(round);
            }
            Msg::Layout { pid, ref mappings } => store.reserve(pid, mappings),
            Msg::Image { meta, host_pids } => return Ok(ImageReceived { meta, host_pids }),
            Msg::Abort { reason } => return Err(MigrateError::Aborted(reason)),
            m => {
                return Err(MigrateError::Protocol(format!(
                    "unexpected {} while receiving pages",
                    m.name()
                )))
            }
        }
    }
}
