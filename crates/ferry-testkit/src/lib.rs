//! Helpers shared by the integration tests of ferry's crates.
//!
//! Tests hold no unsafe code (`unsafe_code = "forbid"` covers them too):
//! what they need from the kernel is here, on top of ferry-sys's safe
//! wrappers, with the panics and skips a test wants instead of results.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicU32, Ordering};

pub use ferry_sys::process::is_root;

mod etcd;
pub use etcd::{etcd_available, EtcdWitness};

/// Returns from the calling test, after saying so on stderr, unless it
/// runs as root: `require_root!();` or `require_root!("why")`.
#[macro_export]
macro_rules! require_root {
    () => {
        $crate::require_root!("needs root")
    };
    ($why:expr) => {
        if !$crate::is_root() {
            eprintln!("SKIPPED {}: {}", $crate::function_name!(), $why);
            return;
        }
    };
}

/// Returns from the calling test, after saying so on stderr, unless the
/// `etcd` program is installed: `require_etcd!();`.
#[macro_export]
macro_rules! require_etcd {
    () => {
        if !$crate::etcd_available() {
            eprintln!(
                "SKIPPED {}: needs etcd (Debian's etcd-server, scripts/install-deps.sh)",
                $crate::function_name!()
            );
            return;
        }
    };
}

/// The path of the function the macro is expanded in (for skip messages).
#[macro_export]
macro_rules! function_name {
    () => {{
        fn f() {}
        let name = ::std::any::type_name_of_val(&f);
        name.strip_suffix("::f").unwrap_or(name)
    }};
}

// ---------------------------------------------------------------------------
// Processes

/// kill(2): sends `sig` to `pid`; false when it failed (ESRCH: gone).
pub fn kill(pid: i32, sig: i32) -> bool {
    ferry_sys::process::kill(pid, sig).is_ok()
}

/// Whether a process `pid` exists (kill with signal 0; a zombie counts).
pub fn exists(pid: i32) -> bool {
    kill(pid, 0)
}

/// Reaps child `pid` if it has ended (waitpid WNOHANG): its status then,
/// None while it runs or when it is not our child.
pub fn try_reap(pid: i32) -> Option<ExitStatus> {
    ferry_sys::process::try_wait_pid(pid).ok().flatten().map(ExitStatus::from_raw)
}

/// Waits for child `pid` to end and reaps it; errors (not our child) are ignored.
pub fn reap(pid: i32) {
    ferry_sys::process::wait_child(pid);
}

/// Kills `pid` with SIGKILL and reaps it (it must be our child to be reaped).
pub fn kill_and_reap(pid: i32) {
    kill(pid, libc::SIGKILL);
    reap(pid);
}

/// Makes this test process the child subreaper of its descendants:
/// orphans of the trees it starts become its children. Panics on failure.
pub fn become_subreaper() {
    ferry_sys::process::set_child_subreaper()
        .unwrap_or_else(|e| panic!("prctl(PR_SET_CHILD_SUBREAPER): {e}"));
}

// ---------------------------------------------------------------------------
// Spawning programs

/// The child of `cmd` starts with only fds 0-2: cargo hands its jobserver
/// pipe (without O_CLOEXEC) to test binaries, and a stray descriptor would
/// leak into the program and into its checkpoint.
pub fn only_stdio(cmd: &mut Command) -> &mut Command {
    ferry_sys::process::set_exec_setup(
        cmd,
        ferry_sys::process::ExecSetup { only_stdio: true, ..Default::default() },
    )
}

/// Like [`only_stdio`], and the child leads a session (and process group)
/// of its own, so its image refers to none of the test's.
pub fn own_session(cmd: &mut Command) -> &mut Command {
    ferry_sys::process::set_exec_setup(
        cmd,
        ferry_sys::process::ExecSetup { only_stdio: true, new_session: true, ..Default::default() },
    )
}

/// Starts `argv` in `cwd` as a service the way the replace tests need it:
/// a session of its own, stdio on /dev/null, the test process a child
/// subreaper (so the service's orphans come back to it). Returns its PID;
/// the caller reaps it (the `Child` is dropped: a service ferry replaces
/// is no longer the process `Child` would wait for).
pub fn spawn_detached(argv: &[&str], cwd: &Path) -> i32 {
    become_subreaper();
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..])
        .current_dir(cwd)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    own_session(&mut cmd);
    let child = cmd.spawn().unwrap_or_else(|e| panic!("starting {}: {e}", argv[0]));
    let pid = child.id() as i32;
    // The caller reaps it by PID.
    drop(child);
    pid
}

/// Like [`own_session`], and the child joins the network namespace at
/// `netns` (a /run/netns file) first. Panics when the file cannot be opened.
pub fn own_session_in_netns<'a>(cmd: &'a mut Command, netns: &Path) -> &'a mut Command {
    let ns = File::open(netns).unwrap_or_else(|e| panic!("open {}: {e}", netns.display()));
    ferry_sys::process::set_exec_setup(
        cmd,
        ferry_sys::process::ExecSetup {
            net_namespace: Some(OwnedFd::from(ns)),
            new_session: true,
            only_stdio: true,
        },
    )
}

// ---------------------------------------------------------------------------
// Descriptors

/// A TCP port on 127.0.0.1 that was free a moment ago (the kernel's pick
/// of an ephemeral port), for a test server to listen on.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local address of a bound listener").port()
}

/// poll(2) on `fds` for at most `timeout_ms`: how many have events (0 on
/// timeout); an interrupted poll counts as a timeout. Panics on other errors.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> usize {
    match ferry_sys::fd::poll(fds, timeout_ms) {
        Ok(n) => n,
        Err(e) if e.errno == libc::EINTR => 0,
        Err(e) => panic!("{e}"),
    }
}

/// Sets an integer socket option (setsockopt) on `sock`. Panics on failure.
pub fn set_socket_option(sock: impl AsFd, level: i32, name: i32, value: i32) {
    use std::os::fd::AsRawFd;
    ferry_sys::socket::setsockopt_int(sock.as_fd().as_raw_fd(), level, name, value)
        .unwrap_or_else(|e| panic!("setsockopt({level}, {name}): {e}"));
}

/// Makes a FIFO at `path` (mode 0600). Panics on failure.
/// Compiles the C program `src` into `bin` with gcc (`-Wall`, optimised);
/// panics with gcc's messages if it fails.
pub fn compile_c(src: &Path, bin: &Path) {
    let out = Command::new("gcc")
        .args(["-O2", "-Wall", "-o"])
        .arg(bin)
        .arg(src)
        .output()
        .unwrap_or_else(|e| panic!("running gcc for {}: {e}", src.display()));
    assert!(
        out.status.success(),
        "gcc {}: {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn mkfifo(path: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
    ferry_sys::fd::mkfifo(&c, 0o600).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// Removes a System V shared memory segment (IPC_RMID); false on failure.
pub fn remove_shm(shmid: i32) -> bool {
    ferry_sys::sysv::shm_remove(shmid).is_ok()
}

// ---------------------------------------------------------------------------
// Network namespaces

/// Moves the calling thread into the network namespace at `path` (a
/// /run/netns file): the sockets it makes from then on live there.
/// Panics on failure.
pub fn enter_netns(path: impl AsRef<Path>) {
    let path = path.as_ref();
    let ns = File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    ferry_sys::netns::enter_net_namespace(ns.as_fd())
        .unwrap_or_else(|e| panic!("entering {}: {e}", path.display()));
}

/// Runs `f` on a thread of its own that joined the network namespace at
/// `path`, and returns its result (the caller's thread stays where it is).
pub fn run_in_netns<T: Send>(path: impl AsRef<Path>, f: impl FnOnce() -> T + Send) -> T {
    let path = path.as_ref();
    std::thread::scope(|s| {
        s.spawn(|| {
            enter_netns(path);
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// A network namespace made for one test (`ip netns add`, loopback up),
/// deleted on drop.
/// A directory of one test: unique on the machine (prefix, tag, PID and a
/// counter), 0755 so that services a test runs as another user (nobody,
/// postgres) can read below it, and removed with all it holds on drop,
/// also when the test fails. With `FERRY_TEST_KEEP` set it is kept and
/// its path printed, to read the logs of a failed run.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(prefix: &str, tag: &str) -> TempDir {
        use std::os::unix::fs::PermissionsExt;
        static N: AtomicU32 = AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "{prefix}-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d)
            .unwrap_or_else(|e| panic!("creating test directory {}: {e}", d.display()));
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("chmod 755 {}: {e}", d.display()));
        TempDir(d)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("FERRY_TEST_KEEP").is_some() {
            eprintln!("kept {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

pub struct NetNs(pub String);

impl NetNs {
    /// None when `ip netns add` does not work here.
    pub fn new(tag: &str) -> Option<NetNs> {
        static N: AtomicU32 = AtomicU32::new(0);
        let name =
            format!("ferry-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst));
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            return None;
        }
        let ns = NetNs(name);
        let up = Command::new("ip")
            .args(["netns", "exec", &ns.0, "ip", "link", "set", "lo", "up"])
            .status();
        assert!(up.map(|s| s.success()).unwrap_or(false), "cannot bring up lo in {}", ns.0);
        Some(ns)
    }

    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.0)
    }

    /// Runs `f` on a thread that has joined this namespace: its sockets
    /// live there.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        run_in_netns(self.path(), f)
    }

    /// Links this namespace to `peer` with a veth pair: `ifname` here with
    /// `addr`, `peer_ifname` there with `peer_addr` (both CIDR, e.g.
    /// "10.0.0.1/30"), both up. The names live only inside the two
    /// namespaces, and the pair goes with them. Panics on failure.
    pub fn link(&self, ifname: &str, addr: &str, peer: &NetNs, peer_ifname: &str, peer_addr: &str) {
        let ip = |args: &[&str]| {
            let ok = Command::new("ip").args(args).status().map(|s| s.success()).unwrap_or(false);
            assert!(ok, "ip {}: failed", args.join(" "));
        };
        let (me, other) = (self.0.as_str(), peer.0.as_str());
        ip(&[
            "-n",
            me,
            "link",
            "add",
            ifname,
            "type",
            "veth",
            "peer",
            "name",
            peer_ifname,
            "netns",
            other,
        ]);
        for (ns, dev, a) in [(self, ifname, addr), (peer, peer_ifname, peer_addr)] {
            ip(&["-n", &ns.0, "addr", "add", a, "dev", dev]);
            ip(&["-n", &ns.0, "link", "set", dev, "up"]);
        }
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // The network lock's program stays attached in a namespace once a
        // lock was made there; remove it with the namespace (a base left
        // behind would wait for the next ferry run's release_stale).
        let netns = ferry_netlock::Netns::Path(self.path().into());
        if let Err(e) = ferry_netlock::release_base_of(&netns) {
            eprintln!("releasing the network lock base of {}: {e}", self.0);
        }
        let _ = Command::new("ip").args(["netns", "delete", &self.0]).status();
    }
}

// ---------------------------------------------------------------------------
// Tests on the main thread

/// The `main` of a test binary without libtest's harness (`harness =
/// false` in Cargo.toml), for tests that must run while the process has
/// one thread: libtest runs each test on a thread of its own, and an
/// in-process fork (a checkpoint's guard, a restore) refuses to run
/// beside another thread. Runs, in turn on the calling thread, each test
/// whose name contains one of the command line's filters (every test when
/// there is none); flags such as --test-threads are ignored, `--skip F`
/// leaves out the tests whose name contains F. A failing test panics.
pub fn run_on_main_thread(tests: &[(&str, fn())]) {
    let mut filters = Vec::new();
    let mut skips = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--skip" {
            skips.extend(args.next());
        } else if !a.starts_with('-') {
            filters.push(a);
        }
    }
    let chosen = |name: &str| {
        (filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
            && !skips.iter().any(|s| name.contains(s.as_str()))
    };
    let mut ran = 0;
    for (name, test) in tests.iter().filter(|(n, _)| chosen(n)) {
        println!("test {name} ...");
        test();
        println!("test {name} ... ok");
        ran += 1;
    }
    println!("test result: ok. {ran} passed; {} filtered out", tests.len() - ran);
}

/// A client of a line protocol (one command per line, one reply line
/// each) on one TCP connection to 127.0.0.1, as the test servers speak.
pub struct LineClient {
    stream: std::net::TcpStream,
    reader: std::io::BufReader<std::net::TcpStream>,
}

impl LineClient {
    /// Connects (panics when it cannot: a test's precondition); replies
    /// are awaited at most 30 s.
    pub fn connect(port: u16) -> LineClient {
        LineClient::try_connect(port).expect("connect")
    }

    /// Connects; the error when nothing listens on `port` (yet).
    pub fn try_connect(port: u16) -> std::io::Result<LineClient> {
        let stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
        stream.set_nodelay(true)?;
        let reader = std::io::BufReader::new(stream.try_clone()?);
        Ok(LineClient { stream, reader })
    }

    /// Sends `line` and returns the reply without its line end; an error
    /// when the connection fails or the server closes it.
    pub fn ask(&mut self, line: &str) -> std::io::Result<String> {
        use std::io::{BufRead, Write};
        self.stream.write_all(format!("{line}\n").as_bytes())?;
        let mut reply = String::new();
        if self.reader.read_line(&mut reply)? == 0 {
            return Err(std::io::Error::other("connection closed"));
        }
        Ok(reply.trim_end().to_string())
    }

    /// One more line of a reply that spans several (redis's bulk strings),
    /// with its line end.
    pub fn read_line(&mut self) -> std::io::Result<String> {
        use std::io::BufRead;
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        Ok(line)
    }
}
