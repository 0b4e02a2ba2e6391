//! The BPF task_file iterator over every fd table of the host
//! ([`ferry_sys::host_files`]), loaded once per ferry process: the
//! outside-sharing check reads the host's fds through it
//! (`outside_files.rs`), and the socket option watch counts it among
//! ferry's own programs (`sockopt_watch.rs`), a tracing program that
//! only reads.

static HOST_FILES: std::sync::OnceLock<Option<ferry_sys::host_files::HostFilesProgram>> =
    std::sync::OnceLock::new();

/// The iterator as the host's list of programs shows it (a tracing
/// program that only reads: the socket option watch must not take it
/// for one that may set options).
pub(crate) fn own_program() -> Option<ferry_sys::bpf::ProgInfo> {
    program()?.info().ok()
}

/// Loads the iterator on a thread of its own ([`crate::parallel::detach`],
/// joined before ferry forks) unless this process has it already: its
/// program load, about half a millisecond, then runs beside a capture's
/// phases before "sharing checked", which reads it.
pub(super) fn load_ahead() {
    if HOST_FILES.get().is_none() {
        crate::parallel::detach("host fds loaded ahead", || {
            let _ = program();
        });
    }
}

/// The iterator, loaded once per process.
pub(super) fn program() -> Option<&'static ferry_sys::host_files::HostFilesProgram> {
    HOST_FILES
        .get_or_init(|| {
            load_host_files()
                .map_err(|e| tracing::debug!("the host's fds are read from /proc: {e}"))
                .ok()
        })
        .as_ref()
}

fn load_host_files() -> std::result::Result<ferry_sys::host_files::HostFilesProgram, String> {
    let mut btf = crate::kernel_btf::KernelBtf::open();
    let ctx = "bpf_iter__task_file";
    let layout = ferry_sys::host_files::HostFilesLayout {
        attach_btf_id: btf.func("bpf_iter_task_file")?,
        ctx_meta: btf.byte(ctx, "meta")?,
        ctx_task: btf.byte(ctx, "task")?,
        ctx_fd: btf.byte(ctx, "fd")?,
        ctx_file: btf.byte(ctx, "file")?,
        meta_seq: btf.byte("bpf_iter_meta", "seq")?,
        task_tgid: btf.byte("task_struct", "tgid")?,
        f_inode: btf.byte("file", "f_inode")?,
        i_ino: btf.byte("inode", "i_ino")?,
        f_flags: btf.byte("file", "f_flags")?,
        task_files: btf.byte("task_struct", "files")?,
        files_fdt: btf.byte("files_struct", "fdt")?,
        fdt_close_on_exec: btf.byte("fdtable", "close_on_exec")?,
    };
    let program =
        ferry_sys::host_files::HostFilesProgram::load(&layout).map_err(|e| e.to_string())?;
    btf.save();
    Ok(program)
}
