//! A progress bar for large page copies, on a terminal only.

use ferry_engine::ProgressFn;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::sync::{Arc, OnceLock};

/// Below this, copies finish before a bar would be worth drawing.
const MIN_BYTES: u64 = 256 << 20;

/// A callback that draws "LABEL [bar] done/total" on stderr, or None when
/// stderr is not a terminal.
pub fn bar(label: &'static str) -> Option<ProgressFn> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let cell: Arc<OnceLock<Option<ProgressBar>>> = Arc::new(OnceLock::new());
    Some(Arc::new(move |done: u64, total: u64| {
        let pb = cell.get_or_init(|| {
            (total >= MIN_BYTES).then(|| {
                let pb = ProgressBar::new(total);
                if let Ok(style) = ProgressStyle::with_template(
                    "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
                ) {
                    pb.set_style(style.progress_chars("=> "));
                }
                pb.set_message(label);
                pb
            })
        });
        if let Some(pb) = pb {
            pb.set_position(done);
            if done >= total {
                pb.finish_and_clear();
            }
        }
    }))
}
