//! `ferry demo`: live migration on one machine. Two test hosts and a
//! client host on one bridge (docs/migration.md, "Test hosts"), ferryd as
//! PID 1 of each host, redis-server in host 1 behind a service address,
//! clients in the client host that keep their connections open and count
//! every request, and `ferry migrate` back and forth between the hosts.
//! At the end a table of the migrations and the clients' totals; every
//! namespace, process and file the demo made is removed on every path
//! (success, failure, Ctrl-C).

mod hosts;
mod load;
mod report;

use anyhow::{anyhow, bail, Context, Result};
use hosts::{Host, Lab};
use indicatif::{ProgressBar, ProgressStyle};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// How many migrations: host1 → host2, host2 → host1, ... alternately.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=50))]
    migrations: u32,
    /// Client connections, each kept open for the whole demo.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    clients: u32,
    /// Stop-and-copy: pass --no-precopy to every `ferry migrate`.
    #[arg(long)]
    no_precopy: bool,
    /// Copy the demo's logs (ferryd, redis, each `ferry migrate` and its
    /// JSON report) into this directory before the demo removes its own.
    #[arg(long, value_name = "DIR")]
    keep_logs: Option<PathBuf>,
}

/// redis's port on the service address.
const REDIS_PORT: u16 = 6379;
/// Keys loaded before the clients start, so the migrations move some memory.
const KEYS: usize = 50_000;
const VALUE_BYTES: usize = 100;
/// Each client sends at most one request per this interval.
const CLIENT_INTERVAL: Duration = Duration::from_millis(2);
/// Load between two migrations.
const BETWEEN: Duration = Duration::from_millis(1500);
/// Longest a single `ferry migrate` may take before the demo gives up.
const MIGRATION_LIMIT: Duration = Duration::from_secs(120);

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Whether SIGINT or SIGTERM arrived; every wait of the demo checks this.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // The handler only stores to an atomic.
        let _ = ferry_sys::signal::set_handler(sig, on_signal);
    }
}

/// Step lines on stdout, and a spinner on stderr with the clients'
/// counters when stderr is a terminal.
struct Ui {
    spinner: ProgressBar,
    step: String,
    started: Instant,
}

impl Ui {
    fn new() -> Ui {
        let spinner = ProgressBar::new_spinner();
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg}") {
            spinner.set_style(style);
        }
        spinner.enable_steady_tick(Duration::from_millis(100));
        Ui { spinner, step: String::new(), started: Instant::now() }
    }

    fn println(&self, line: &str) {
        self.spinner.suspend(|| println!("{line}"));
    }

    fn step(&mut self, what: &str) {
        self.step = what.to_string();
        self.println(&format!("==> {what}"));
        self.spinner.set_message(what.to_string());
    }

    fn say(&self, what: &str) {
        self.println(&format!("    {what}"));
    }

    /// Refreshes the spinner: the step, a detail, the clients' counters.
    fn status(&self, detail: &str, load: Option<&load::Load>) {
        let mut m = self.step.clone();
        if !detail.is_empty() {
            m.push_str(&format!(" ({detail})"));
        }
        if let Some(l) = load {
            m.push_str(&format!(" | {} requests, {} failed", l.done(), l.failed()));
        }
        m.push_str(&format!(" | {:.0} s", self.started.elapsed().as_secs_f64()));
        self.spinner.set_message(m);
    }

    fn finish(&self) {
        self.spinner.finish_and_clear();
    }
}

/// The demo's private directory (0700): key, logs, reports, redis's files.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir> {
        use std::os::unix::fs::DirBuilderExt;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path =
            std::env::temp_dir().join(format!("ferry-demo-{}-{nanos:x}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Copies the *.log and *.json files of `from` into `to` (created).
fn copy_logs(from: &Path, to: &Path) -> Result<usize> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    let mut n = 0;
    for e in std::fs::read_dir(from)?.flatten() {
        let p = e.path();
        if matches!(p.extension().and_then(|x| x.to_str()), Some("log" | "json")) {
            std::fs::copy(&p, to.join(e.file_name()))
                .with_context(|| format!("copying {}", p.display()))?;
            n += 1;
        }
    }
    Ok(n)
}

/// Sleeps `d` while refreshing the spinner; fails when interrupted.
fn pause(ui: &Ui, d: Duration, load: Option<&load::Load>) -> Result<()> {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if interrupted() {
            bail!("interrupted");
        }
        ui.status("", load);
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Marks every descriptor above stderr close-on-exec. Whatever the demo
/// inherited (a pipe of the shell or of a CI runner) must not reach
/// ferryd or redis: a descriptor the service shares with a process
/// outside its tree cannot be migrated.
fn no_inherited_fds() {
    ferry_sys::fd::set_cloexec_from(3);
}

fn find_in_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(["/usr/bin".into(), "/usr/sbin".into(), "/usr/local/bin".into()])
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// The programs the demo runs, found before it makes anything.
struct Programs {
    exe: PathBuf,
    ferryd: PathBuf,
    redis: PathBuf,
}

fn find_programs() -> Result<Programs> {
    let exe = std::env::current_exe().context("finding ferry's own executable")?;
    let ferryd = exe.with_file_name("ferryd");
    if !ferryd.is_file() {
        bail!(
            "ferryd not found next to ferry ({}): build both with cargo build --release",
            ferryd.display()
        );
    }
    let redis = find_in_path("redis-server").ok_or_else(|| {
        anyhow!("redis-server not found: install redis-server (scripts/install-deps.sh does)")
    })?;
    for tool in ["ip", "nsenter", "unshare", "setsid"] {
        find_in_path(tool)
            .ok_or_else(|| anyhow!("{tool} not found: install iproute2 and util-linux"))?;
    }
    Ok(Programs { exe, ferryd, redis })
}

pub fn run(args: DemoArgs) -> Result<i32> {
    if !ferry_sys::process::is_root() {
        bail!("ferry demo needs root (network and PID namespaces, ptrace); run it as root");
    }
    let programs = find_programs()?;
    install_signal_handlers();
    no_inherited_fds();

    let mut ui = Ui::new();
    println!(
        "ferry demo: redis-server moves between two test hosts {} times while {} clients keep their connections open",
        args.migrations, args.clients
    );
    // Dropped in reverse order: the clients stop, the hosts' processes
    // end, the namespaces go, then the directory. run_demo's error or an
    // interrupt lands here, and the cleanup below runs in every case (Drop
    // does it too, should anything panic).
    let tmp = TempDir::new()?;
    let mut lab: Option<Lab> = None;
    let outcome = run_demo(&args, &mut ui, &programs, &tmp.0, &mut lab);
    let left = clean_up(&mut ui, args.keep_logs.as_deref(), tmp, lab);

    match outcome {
        Ok(()) if !left.is_empty() => bail!("namespaces left behind: {}", left.join(", ")),
        Ok(()) => {
            println!("DEMO OK: every request answered, every connection kept, through {} live migrations", args.migrations);
            Ok(0)
        }
        Err(_) if interrupted() => {
            eprintln!("ferry: demo interrupted; everything it made is removed");
            Ok(130)
        }
        Err(e) => Err(e),
    }
}

/// Copies the logs out if asked, then removes the hosts (first) and the
/// directory; returns the namespaces that could not be removed.
fn clean_up(ui: &mut Ui, keep_logs: Option<&Path>, tmp: TempDir, lab: Option<Lab>) -> Vec<String> {
    ui.step("cleaning up");
    if let Some(dir) = keep_logs {
        match copy_logs(&tmp.0, dir) {
            Ok(n) => ui.say(&format!("copied {n} logs and reports to {}", dir.display())),
            Err(e) => ui.say(&format!("could not copy the logs to {}: {e:#}", dir.display())),
        }
    }
    let mut made = 0;
    let mut left = Vec::new();
    let tag = lab.as_ref().map(|l| l.tag.clone());
    if let Some(mut l) = lab {
        made = l.namespaces();
        left = l.teardown();
    }
    let dir = tmp.0.display().to_string();
    drop(tmp);
    ui.finish();
    if left.is_empty() {
        let ns = match &tag {
            Some(t) if made > 0 => format!("{made} network namespaces ({t}-*) with their bridge and veths, every process in the hosts, "),
            _ => String::new(),
        };
        ui.say(&format!("removed {ns}{dir}"));
    } else {
        ui.say(&format!("could not remove: {}", left.join(", ")));
    }
    left
}

/// Where the clients reach redis: its address, from the client host's
/// network namespace.
struct Service {
    svc: Ipv4Addr,
    addr: SocketAddr,
    netns: PathBuf,
}

fn run_demo(
    args: &DemoArgs,
    ui: &mut Ui,
    programs: &Programs,
    tmp: &Path,
    slot: &mut Option<Lab>,
) -> Result<()> {
    ui.step("creating test hosts");
    let lab = slot.insert(Lab::new(2).context("creating the test hosts")?);
    let svc = lab.addr(100);
    ui.say(&format!(
        "bridge in {}-br; host1 {}, host2 {}, client {} (namespaces {}-host1, -host2, -client); service address {svc}",
        lab.tag, lab.hosts[0].ip, lab.hosts[1].ip, lab.client_ip, lab.tag
    ));
    let key = start_agents(ui, lab, &programs.ferryd, tmp)?;

    ui.step(&format!("starting redis-server in host1 on {svc}:{REDIS_PORT}"));
    let pid = start_redis(lab, &programs.redis, svc, tmp)?;
    let service = Service {
        svc,
        addr: SocketAddr::new(IpAddr::V4(svc), REDIS_PORT),
        netns: lab.client_netns_path(),
    };
    ui.say(&format!("redis-server is pid {pid} in host1"));

    ui.step(&format!("loading {KEYS} keys of {VALUE_BYTES} bytes from the client host"));
    let addr = service.addr;
    load::in_netns(&service.netns, move || {
        let mut c = load::Conn::connect(addr)?;
        c.populate(KEYS, VALUE_BYTES)
    })
    .context("loading keys into redis")?;

    ui.step(&format!(
        "starting {} clients in the client host (one connection each, one INCR every {} ms)",
        args.clients,
        CLIENT_INTERVAL.as_millis()
    ));
    let load =
        load::Load::start(&service.netns, service.addr, args.clients as usize, CLIENT_INTERVAL)?;
    pause(ui, BETWEEN, Some(&load))?;

    let setup = MigrationSetup {
        exe: &programs.exe,
        key: &key,
        tmp,
        svc: service.svc,
        no_precopy: args.no_precopy,
    };
    let migrations = migrate_back_and_forth(ui, lab, &setup, args.migrations, pid, &load)?;
    report_and_check(ui, &migrations, load, &service)
}

/// Writes the shared key and starts ferryd in both hosts; returns the
/// key's path.
fn start_agents(ui: &mut Ui, lab: &mut Lab, ferryd: &Path, tmp: &Path) -> Result<PathBuf> {
    let key = tmp.join("key");
    ferry_transport::Key::write_new(&key)
        .with_context(|| format!("writing the shared key {}", key.display()))?;
    ui.step("starting ferryd as PID 1 of host1 and host2");
    lab.start_agents(ferryd, &key, tmp)?;
    for h in &lab.hosts {
        ui.say(&format!(
            "{}: ferryd listening on {} (pid {} from here)",
            h.name,
            h.ferryd_addr(),
            h.init_pid()
        ));
    }
    Ok(key)
}

/// What every `ferry migrate` of the demo is given besides its hosts.
struct MigrationSetup<'a> {
    exe: &'a Path,
    key: &'a Path,
    tmp: &'a Path,
    svc: Ipv4Addr,
    no_precopy: bool,
}

/// Moves redis (PID `pid` in host1) `count` times, alternating between
/// the hosts, with load in between.
fn migrate_back_and_forth(
    ui: &mut Ui,
    lab: &mut Lab,
    setup: &MigrationSetup,
    count: u32,
    pid: i32,
    load: &load::Load,
) -> Result<Vec<report::Migration>> {
    let mut migrations = Vec::new();
    let mut pid = pid;
    let mut at = 0usize;
    for k in 0..count as usize {
        let to = 1 - at;
        let (from_name, to_name) = (lab.hosts[at].name.clone(), lab.hosts[to].name.clone());
        ui.step(&format!(
            "migrating {}/{}: {from_name} → {to_name} (redis pid {pid} in {from_name})",
            k + 1,
            count
        ));
        load.take_window_max_ms();
        let mut m = migrate(
            ui,
            lab,
            setup.exe,
            setup.key,
            at,
            to,
            pid,
            setup.svc,
            setup.tmp,
            k,
            load,
            setup.no_precopy,
        )?;
        // A request held by the pause ends right after it: let it finish.
        std::thread::sleep(std::time::Duration::from_millis(100));
        m.client_max_ms = load.take_window_max_ms();
        ui.say(&format!(
            "pause {:.1} ms, longest request {:.1} ms, {:.1} MiB sent, {} pre-copy rounds; redis is pid {} in {to_name}; clients: {} requests, {} failed",
            m.pause_ms,
            m.client_max_ms,
            m.bytes_sent as f64 / 1048576.0,
            m.rounds,
            m.dest_host_pid,
            load.done(),
            load.failed()
        ));
        if let Some(e) =
            load.counters.first_error.lock().unwrap_or_else(|p| p.into_inner()).as_deref()
        {
            ui.say(&format!("first client error: {e}"));
        }
        pid = m.dest_host_pid;
        at = to;
        migrations.push(m);
        pause(ui, BETWEEN, Some(load))?;
    }
    Ok(migrations)
}

/// Stops the clients, prints the report, and fails unless every request
/// was answered and every counter and key is where it should be.
fn report_and_check(
    ui: &mut Ui,
    migrations: &[report::Migration],
    load: load::Load,
    service: &Service,
) -> Result<()> {
    ui.step("stopping the clients (each reads its counter back on its own connection)");
    let summary = load.stop();
    let addr = service.addr;
    let keys = load::in_netns(&service.netns, move || load::Conn::connect(addr)?.int(&[b"DBSIZE"]))
        .context("asking redis for its key count")?;
    ui.println("");
    ui.println("Report");
    for line in report::render(migrations, &summary).lines() {
        ui.println(line);
    }
    let expected_keys = KEYS as i64 + summary.clients as i64;
    ui.println(&format!(
        "  redis holds {keys} keys ({KEYS} loaded + {} counters)",
        summary.clients
    ));
    ui.println("");
    if summary.failed > 0 {
        bail!(
            "{} of {} client requests failed (first: {})",
            summary.failed,
            summary.done + summary.failed,
            summary.first_error.unwrap_or_default()
        );
    }
    if summary.counters_ok != summary.clients {
        bail!(
            "{} of {} clients' counters do not match their acknowledged INCRs",
            summary.clients - summary.counters_ok,
            summary.clients
        );
    }
    if keys != expected_keys {
        bail!("redis holds {keys} keys after the migrations, {expected_keys} expected");
    }
    Ok(())
}

/// Puts the service address on host1, starts redis-server there bound to
/// it, and waits until it answers from the client host. Returns its PID
/// inside host1.
fn start_redis(lab: &mut Lab, redis: &Path, svc: std::net::Ipv4Addr, tmp: &Path) -> Result<i32> {
    lab.add_address(0, svc)?;
    let pidfile = tmp.join("redis.pid");
    let log = tmp.join("redis.log");
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .with_context(|| format!("creating {}", log.display()))?;
    // setsid: redis leads its own session and process group, so its image
    // refers to nothing outside its tree. stdin is /dev/null and its log
    // a file in the demo's directory, which every host sees at that path.
    let mut cmd = lab.hosts[0].command(Path::new("setsid"));
    cmd.arg(redis)
        .args(["--bind", &svc.to_string(), "--port", &REDIS_PORT.to_string()])
        .args(["--protected-mode", "no", "--save", "", "--appendonly", "no", "--daemonize", "no"])
        .arg("--pidfile")
        .arg(&pidfile)
        .arg("--dir")
        .arg(tmp)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    let idx = lab.spawn(&mut cmd)?;
    let addr = SocketAddr::new(IpAddr::V4(svc), REDIS_PORT);
    let netns = lab.client_netns_path();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(Some(status)) = lab.try_wait(idx) {
            bail!("redis-server ended at once ({status}): {}", hosts::last_line(&log));
        }
        if interrupted() {
            bail!("interrupted");
        }
        if pidfile.exists() {
            let ping = load::in_netns(&netns, move || {
                let mut c = load::Conn::connect(addr)?;
                c.ok(&[b"PING"])
            });
            if ping.is_ok() {
                return hosts::read_pidfile(&pidfile);
            }
        }
        if Instant::now() > deadline {
            bail!("redis-server did not answer on {addr} within 20 s: {}", hosts::last_line(&log));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `ferry migrate` inside host `from` (nsenter into its namespaces)
/// towards host `to`'s ferryd, and reads its report.
#[allow(clippy::too_many_arguments)]
fn migrate(
    ui: &Ui,
    lab: &mut Lab,
    exe: &Path,
    key: &Path,
    from: usize,
    to: usize,
    pid: i32,
    svc: std::net::Ipv4Addr,
    tmp: &Path,
    k: usize,
    load: &load::Load,
    no_precopy: bool,
) -> Result<report::Migration> {
    let report = tmp.join(format!("migration-{}.json", k + 1));
    let log = tmp.join(format!("migration-{}.log", k + 1));
    let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let (src, dst): (&Host, &Host) = (&lab.hosts[from], &lab.hosts[to]);
    let (src_name, dst_name) = (src.name.clone(), dst.name.clone());
    let mut cmd = src.command(exe);
    cmd.args(["migrate", "--pid", &pid.to_string(), "--to", &dst.ferryd_addr(), "--key"])
        .arg(key)
        .args(["--address", &format!("{svc}/24"), "--report"])
        .arg(&report)
        .args(no_precopy.then_some("--no-precopy"))
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    let idx = lab.spawn(&mut cmd)?;
    let deadline = Instant::now() + MIGRATION_LIMIT;
    let status = loop {
        if let Some(status) = lab.try_wait(idx)? {
            break status;
        }
        if interrupted() {
            bail!("interrupted");
        }
        if Instant::now() > deadline {
            bail!(
                "migration {} ({src_name} → {dst_name}) did not end within {} s",
                k + 1,
                MIGRATION_LIMIT.as_secs()
            );
        }
        let last = hosts::last_line(&log);
        ui.status(last.strip_prefix("ferry: ").unwrap_or(&last), Some(load));
        std::thread::sleep(Duration::from_millis(50));
    };
    if !status.success() {
        let why = hosts::last_line(&log);
        let why = why.strip_prefix("ferry: error: ").unwrap_or(&why);
        bail!("migration {} ({src_name} → {dst_name}) failed: {why}", k + 1);
    }
    report::Migration::read(&report, &src_name, &dst_name)
}
