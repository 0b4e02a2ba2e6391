#!/usr/bin/env bash
# Install what ferry's build, demo, tests and benchmarks need, via apt-get only.
#
# Idempotent: packages already present are left alone, and apt-get is not run
# at all when nothing is missing. Debian's redis-server, memcached, nginx,
# haproxy, openssh-server (service "ssh") and postgresql packages would start
# system services on install (on
# the default ports); we prevent that with a temporary policy-rc.d and stop/disable them
# afterwards anyway, so tests can start their own instances on their own ports.
# postgresql-common would also create a default cluster "15/main" on first
# install; a drop-in in /etc/postgresql-common/createcluster.d/ turns that off
# (see configure_version in /usr/share/postgresql-common/maintscripts-functions),
# and a main cluster that appears during our install anyway is dropped.
#
# The Rust toolchain is only checked, never downloaded: Debian bookworm's cargo
# is older than the workspace's rust-version, so install rustup/cargo yourself.
set -euo pipefail

log() { printf '[install-deps] %s\n' "$*"; }
warn() { printf '[install-deps] WARNING: %s\n' "$*" >&2; }

# package -> reason (kept as a plain list so the order is stable)
PACKAGES=(
  build-essential   # gcc, make, libc headers: examples/, bench/, tests
  pkg-config
  python3           # Debian's /usr/bin/python3, used by tests and the demo
  procps            # ps, pgrep (diagnostics)
  iproute2          # ss (diagnostics of listening sockets)
  redis-server      # real-program test + benchmark (multi-threaded)
  redis-tools       # redis-cli
  memcached         # real-program test (multi-threaded)
  hyperfine         # optional, handy for ad-hoc timing
  ca-certificates
  nginx             # real-tree test + tree benchmark (master + workers); in bookworm
                    # 'nginx' itself ships /usr/sbin/nginx, nginx-light/-core only add modules
  postgresql-15     # real-tree test (postmaster + background processes)
  postgresql-client-15  # psql
  clang             # compiles the network lock's BPF program (crates/ferry-netlock/build.rs)
  llvm              # llvm-objdump/llvm-strip for inspecting that BPF object
  libbpf-dev        # <bpf/bpf_helpers.h> for the BPF program
  bpftool           # inspecting pinned network-lock maps and links (diagnostics)
  iptables          # network lock, --network-lock iptables (and its tests)
  nftables          # network lock, --network-lock nftables (and its tests)
  apache2-utils     # ab (ApacheBench): nginx under load during a migration (bench/migrate.py)
  python3-matplotlib  # the benchmarks' PNG plots (bench/tcp.py, bench/migrate.py)
  haproxy           # real-program test: a proxy's backend connections and the migration's checks
  openjdk-17-jre-headless  # runtimes test: a JVM HTTP server (its module image has jdk.compiler
                    # and jdk.httpserver, so `java Server.java` runs a source file)
  nodejs            # runtimes test: a Node HTTP server
  openssh-server    # real-program test: ssh sessions (with and without a pty) migrated with sshd
  openssh-client    # ssh, the sessions' client in that test
  protobuf-compiler # protoc: etcd-client's build script compiles etcd's .proto files (crates/ferry-fence)
  libprotobuf-dev   # google/protobuf/*.proto (descriptor, struct) that etcd's .proto files import
  etcd-server       # etcd, the replication fence's witness; tests start their own (ferry_testkit::EtcdWitness)
  btrfs-progs       # btrfs send/receive: `ferry replicate --data-dir`; mkfs.btrfs for its tests
)
SERVICES=(redis-server memcached nginx postgresql haproxy ssh etcd)
PG_VERSION=15
PG_NO_MAIN_CLUSTER=/etc/postgresql-common/createcluster.d/ferry-no-main-cluster.conf

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
  else
    SUDO=(__none__)
  fi
fi

run_root() {
  if [ "${SUDO[0]:-}" = "__none__" ]; then
    return 1
  fi
  "${SUDO[@]}" "$@"
}

is_installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed$'
}

stop_and_disable_services() {
  for svc in "${SERVICES[@]}"; do
    [ -e "/etc/init.d/$svc" ] || [ -e "/lib/systemd/system/$svc.service" ] || continue
    # systemd (only when it is actually PID 1)
    if command -v systemctl >/dev/null 2>&1; then
      if [ -d /run/systemd/system ]; then
        run_root systemctl stop "$svc" >/dev/null 2>&1 || true
      fi
      # 'disable' only edits unit symlinks, so it also works without systemd
      # running; skip it when already disabled to keep re-runs quiet.
      if [ "$(systemctl is-enabled "$svc" 2>/dev/null || true)" = enabled ]; then
        run_root systemctl disable "$svc" >/dev/null 2>&1 || true
      fi
    fi
    # SysV init scripts (containers, no systemd)
    if command -v service >/dev/null 2>&1 && [ -e "/etc/init.d/$svc" ]; then
      run_root service "$svc" stop >/dev/null 2>&1 || true
    fi
    if command -v update-rc.d >/dev/null 2>&1 && [ -e "/etc/init.d/$svc" ]; then
      run_root update-rc.d "$svc" disable >/dev/null 2>&1 || true
    fi
  done
  # Anything still running from the distribution's service config (default
  # ports 6379 / 11211 / 2379, run as the packages' system users) is a leftover of a
  # service start: stop it by PID. We never touch instances run by root, which
  # are the ones our own tests start.
  local pid user
  for user in redis memcache etcd; do
    for pid in $(pgrep -u "$user" 2>/dev/null || true); do
      log "stopping leftover system service process $pid (user $user)"
      run_root kill "$pid" 2>/dev/null || true
    done
  done
  # nginx and postgres are keyed on the system instance's own files, not on a
  # user: our tests run nginx as root (workers as nobody) and postgres as user
  # postgres, always with their pidfiles and data in a temporary directory.
  # nginx: only the master named in Debian's default pidfile /run/nginx.pid.
  local f
  if [ -s /run/nginx.pid ]; then
    pid="$(tr -dc '0-9' </run/nginx.pid)"
    if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = nginx ]; then
      log "stopping leftover system nginx master $pid (/run/nginx.pid)"
      run_root kill -QUIT "$pid" 2>/dev/null || true
    fi
  fi
  # postgres: only clusters registered with postgresql-common (/etc/postgresql),
  # through their pidfiles in /var/run/postgresql (external_pid_file) or their
  # data directory under /var/lib/postgresql. Fast shutdown (SIGINT).
  for f in /var/run/postgresql/*.pid /var/lib/postgresql/*/*/postmaster.pid; do
    [ -s "$f" ] || continue
    pid="$(head -n1 "$f" | tr -dc '0-9')"
    [ -n "$pid" ] || continue
    case "$(cat "/proc/$pid/comm" 2>/dev/null)" in
      postgres|postmaster)
        log "stopping leftover system postgres $pid ($f)"
        run_root kill -INT "$pid" 2>/dev/null || true ;;
    esac
  done
}

# Keep postgresql-common from creating the default cluster on first install:
# configure_version() reads create_main_cluster with pg_conftool from
# createcluster.conf, which includes createcluster.d/*.conf. A drop-in file
# there leaves the packaged (ucf-managed) createcluster.conf alone.
prevent_pg_main_cluster() {
  [ -e "$PG_NO_MAIN_CLUSTER" ] && return 0
  run_root mkdir -p "$(dirname "$PG_NO_MAIN_CLUSTER")"
  printf '%s\n' '# written by ferry scripts/install-deps.sh: no default cluster on install' \
    'create_main_cluster = false' | run_root tee "$PG_NO_MAIN_CLUSTER" >/dev/null
}

# --- Rust toolchain -----------------------------------------------------------
if ! command -v cargo >/dev/null 2>&1; then
  for d in "$HOME/.cargo/bin" /root/.cargo/bin; do
    if [ -x "$d/cargo" ]; then
      warn "cargo is not on PATH but exists in $d; add it: export PATH=\"$d:\$PATH\""
      break
    fi
  done
  cat >&2 <<'EOF'
[install-deps] ERROR: cargo (the Rust toolchain) was not found on PATH.
[install-deps]   ferry needs Rust >= 1.80 (see rust-version in Cargo.toml).
[install-deps]   Debian bookworm's own 'cargo' package is too old; install a
[install-deps]   current toolchain with rustup and re-run this script.
EOF
  exit 1
fi
log "cargo: $(cargo --version)"

# --- Debian packages ----------------------------------------------------------
if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
  warn "not a Debian-like system (no dpkg/apt-get); install manually: ${PACKAGES[*]}"
  exit 0
fi

MISSING=()
for p in "${PACKAGES[@]}"; do
  is_installed "$p" || MISSING+=("$p")
done

if [ "${#MISSING[@]}" -eq 0 ]; then
  log "all packages present: ${PACKAGES[*]}"
else
  log "missing packages: ${MISSING[*]}"
  if [ "${SUDO[0]:-}" = "__none__" ]; then
    warn "not root and no passwordless sudo: cannot install ${MISSING[*]}."
    warn "tests that need those programs will be skipped."
    exit 0
  fi

  # Keep maintainer scripts from starting services during installation.
  CREATED_POLICY=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    run_root sh -c 'printf "#!/bin/sh\nexit 101\n" > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d'
    CREATED_POLICY=1
  fi
  cleanup_policy() {
    if [ "$CREATED_POLICY" = 1 ]; then
      run_root rm -f /usr/sbin/policy-rc.d || true
    fi
  }
  trap cleanup_policy EXIT

  # A default postgres cluster that did not exist before this install must not
  # exist after it either (in case the drop-in was not honoured).
  HAD_PG_MAIN=0
  [ -e "/etc/postgresql/$PG_VERSION/main" ] && HAD_PG_MAIN=1
  prevent_pg_main_cluster

  export DEBIAN_FRONTEND=noninteractive
  # ucf (postgresql-common's createcluster.conf): keep existing files.
  export UCF_FORCE_CONFFOLD=1
  APT_OPTS=(-y -q -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
  # Refresh the package lists at most once per run, and only when needed.
  if ! run_root apt-get install "${APT_OPTS[@]}" --no-install-recommends "${MISSING[@]}"; then
    log "apt-get install failed; refreshing package lists and retrying"
    run_root apt-get update -q
    run_root apt-get install "${APT_OPTS[@]}" --no-install-recommends "${MISSING[@]}"
  fi
  cleanup_policy
  trap - EXIT
  if [ "$HAD_PG_MAIN" = 0 ] && [ -e "/etc/postgresql/$PG_VERSION/main" ] && command -v pg_dropcluster >/dev/null 2>&1; then
    log "dropping the default postgres cluster $PG_VERSION/main created by the install"
    run_root pg_dropcluster --stop "$PG_VERSION" main || warn "pg_dropcluster $PG_VERSION main failed"
  fi
fi

stop_and_disable_services

for tool in gcc python3 protoc etcd redis-server redis-cli memcached nginx psql /usr/lib/postgresql/$PG_VERSION/bin/postgres; do
  if command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/bin/$tool" ] || [ -x "/usr/sbin/$tool" ]; then
    :
  else
    warn "$tool still not found after installation"
  fi
done
log "done"
