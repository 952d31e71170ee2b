//! Issue 36, item 3: `softverbs daemon` as the system service runs it (dist/systemd/), with
//! `systemd-socket-activate` playing the socket unit and a datagram socket of the test's
//! playing systemd's notification socket (no running systemd needed): the daemon serves the
//! socket it is passed, says READY=1 once its devices are up, reads its configuration again
//! on SIGHUP (what a client sees changes), and keeps the running configuration when the new
//! file is broken. Also the configuration file as a user meets it: devices named by
//! interface, an unknown key refused by name, a flag overriding the file.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use softverbs::Context;

const BIN: &str = env!("CARGO_BIN_EXE_softverbs");
/// Long enough for a loaded CI machine; only a failing test waits this long.
const WAIT: Duration = Duration::from_secs(60);

/// A directory of the test's own (0700), removed on drop.
struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes a configuration file as an administrator would: 0644 whatever the umask (the
/// daemon refuses a file group or others could write).
fn write_config(path: &Path, text: impl AsRef<str>) {
    std::fs::write(path, text.as_ref()).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
}

fn dir(name: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("svservice-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    Dir(d)
}

/// `systemd-socket-activate` holding the listening socket, then (from the first
/// connection on) the daemon it execs in its place; SIGTERM on drop, as systemd stops it.
struct Service {
    child: Child,
    socket: PathBuf,
    notify: UnixDatagram,
    log: PathBuf,
}

impl Service {
    fn start(d: &Path, config: &Path, flags: &[&str]) -> Service {
        let socket = d.join("softverbs.sock");
        let notify_path = d.join("notify");
        let notify = UnixDatagram::bind(&notify_path).unwrap();
        notify.set_read_timeout(Some(WAIT)).unwrap();
        let log = d.join("daemon.log");
        let child = Command::new("systemd-socket-activate")
            .arg("--seqpacket")
            .arg("--listen")
            .arg(&socket)
            .arg(format!("--setenv=NOTIFY_SOCKET={}", notify_path.display()))
            .arg("--setenv=SOFTVERBS_LOG=info")
            .arg(BIN)
            .arg("daemon")
            .arg("--config")
            .arg(config)
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("systemd-socket-activate (Debian package systemd)");
        // The activator creates the socket before it waits for a connection.
        let deadline = Instant::now() + WAIT;
        while !socket.exists() {
            assert!(
                Instant::now() < deadline,
                "no socket at {}",
                socket.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Service {
            child,
            socket,
            notify,
            log,
        }
    }

    /// The next notification datagram, its lines.
    fn notice(&self) -> Vec<String> {
        let mut buf = [0u8; 4096];
        let n = self
            .notify
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("no notification ({e}); log:\n{}", self.log()));
        String::from_utf8_lossy(&buf[..n])
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Waits for the notification that ends a reload: `STATUS=...` and `READY=1`; returns
    /// the status line.
    fn reloaded(&self) -> String {
        let first = self.notice();
        assert_eq!(first[0], "RELOADING=1", "{first:?}");
        assert!(first[1].starts_with("MONOTONIC_USEC="), "{first:?}");
        let second = self.notice();
        assert_eq!(second.last().map(String::as_str), Some("READY=1"));
        second[0]
            .strip_prefix("STATUS=")
            .expect("a status line")
            .to_string()
    }

    fn hangup(&self) {
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::HUP,
        )
        .unwrap();
    }

    fn status(&self) -> Value {
        let o = Command::new(BIN)
            .arg("--socket")
            .arg(&self.socket)
            .args(["status", "--json"])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "status: {}; log:\n{}",
            String::from_utf8_lossy(&o.stderr),
            self.log()
        );
        serde_json::from_slice(&o.stdout).unwrap()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::TERM,
        );
        let _ = self.child.wait();
    }
}

/// The per-context limit of `resource` as `status --json` shows it.
fn context_limit(status: &Value, resource: &str) -> Value {
    status["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["resource"] == resource)
        .unwrap_or_else(|| panic!("no limit {resource}"))["context"]
        .clone()
}

/// How many PDs one new context gets before the daemon refuses (`ENOMEM`), up to `max`.
fn pds_granted(socket: &Path, max: usize) -> usize {
    let ctx = Context::open_at(socket, 0).expect("open the device");
    let mut pds = Vec::new();
    while pds.len() < max {
        match ctx.alloc_pd() {
            Ok(pd) => pds.push(pd),
            Err(e) => {
                assert_eq!(e.errno(), softverbs::errno::ENOMEM, "{e}");
                break;
            }
        }
    }
    pds.len()
}

const CONFIG: &str = r#"
network = false
[devices]
softverbs0 = "lo"
[limits.context]
pds = 2
cqs = 3
"#;

#[test]
fn socket_activation_readiness_and_reload() {
    let d = dir("activate");
    let config = d.0.join("softverbs.toml");
    write_config(&config, CONFIG);
    // The flag overrides the file's cqs, now and at every reload.
    let svc = Service::start(&d.0, &config, &["--limit", "context.cqs=7"]);

    // The first client's connection starts the daemon on the passed socket, and it answers.
    let s = svc.status();
    assert_eq!(svc.notice(), ["READY=1"], "READY=1 once the devices are up");
    assert_eq!(
        s["daemon_pid"],
        svc.child.id(),
        "the activator exec'd the daemon"
    );
    // `lo` names the device's addresses: 127.0.0.1 first, and ::1 (lo has it unless IPv6
    // is off on this host).
    let addrs = &s["device_status"][0]["ports"][0]["addrs"];
    assert_eq!(addrs[0], "127.0.0.1", "{addrs}");
    assert_eq!(context_limit(&s, "pds"), 2);
    assert_eq!(context_limit(&s, "cqs"), 7, "the flag wins over the file");
    assert_eq!(pds_granted(&svc.socket, 10), 2);

    // `systemctl reload`: a changed limit is what the next client sees.
    write_config(&config, CONFIG.replace("pds = 2", "pds = 5"));
    svc.hangup();
    let status = svc.reloaded();
    assert!(status.contains("limits changed"), "{status}");
    let s = svc.status();
    assert_eq!(context_limit(&s, "pds"), 5);
    assert_eq!(context_limit(&s, "cqs"), 7, "the flag still wins");
    assert_eq!(pds_granted(&svc.socket, 10), 5);

    // A broken file is refused by name, and the running configuration stays.
    write_config(&config, CONFIG.replace("pds = 2", "pdz = 1"));
    svc.hangup();
    let status = svc.reloaded();
    assert!(
        status.contains("refused") && status.contains("pdz"),
        "{status}"
    );
    assert_eq!(context_limit(&svc.status(), "pds"), 5);
    assert_eq!(pds_granted(&svc.socket, 10), 5);

    // What needs a restart is said, and the limits still change.
    std::fs::write(
        &config,
        CONFIG
            .replace("pds = 2", "pds = 4")
            .replace("network = false", "network = false\nport = 4792"),
    )
    .unwrap();
    svc.hangup();
    let status = svc.reloaded();
    assert!(status.contains("port take effect at restart"), "{status}");
    assert_eq!(pds_granted(&svc.socket, 10), 4);
    drop(svc);
    // The socket is the socket unit's: the daemon leaves it where it was.
    assert!(d.0.join("softverbs.sock").exists());
}

/// Starts `softverbs daemon --config FILE` on a socket in `d`; it must refuse to start, and
/// what it said on stderr is returned.
fn refused(d: &Dir, config: &std::path::Path) -> String {
    let o = Command::new(BIN)
        .arg("--socket")
        .arg(d.0.join("s.sock"))
        .arg("daemon")
        .arg("--config")
        .arg(config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "the daemon started: {err}");
    assert!(!d.0.join("s.sock").exists(), "refused before serving");
    err
}

#[test]
fn an_unknown_key_a_missing_interface_and_a_writable_file_are_refused() {
    let d = dir("unknown");
    let config = d.0.join("softverbs.toml");
    write_config(&config, "network = false\n[limits.uid]\nmapings = 8192\n");
    let err = refused(&d, &config);
    assert!(err.contains("limits.uid.mapings"), "{err}");

    // A file others could have written is refused whatever it says.
    std::fs::write(&config, "network = false\n").unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o666)).unwrap();
    let err = refused(&d, &config);
    assert!(err.contains("writable by group or others"), "{err}");
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();

    write_config(&config, "[devices]\nsoftverbs0 = \"no-such-if0\"\n");
    let err = refused(&d, &config);
    assert!(
        err.contains("devices.softverbs0") && err.contains("no interface no-such-if0"),
        "{err}"
    );
}

#[test]
fn the_shipped_example_is_valid() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/softverbs.toml");
    let text = std::fs::read_to_string(&example).unwrap();
    softverbs_daemon::config_file::parse(&text)
        .unwrap_or_else(|e| panic!("{}: {e}", example.display()));
}

/// The units as shipped: systemd reads them without a complaint (an unknown or misspelt
/// directive is only a warning to systemd, so any output fails), with ExecStart= pointing at
/// this build; and the socket unit listens where the root daemon and its clients look.
#[test]
fn the_units_verify_and_listen_where_root_clients_look() {
    let dist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/systemd");
    let d = dir("units");
    let mut units = Vec::new();
    for name in ["softverbs.socket", "softverbs.service"] {
        let text = std::fs::read_to_string(dist.join(name)).unwrap();
        assert!(
            name.ends_with(".socket")
                || text.contains(
                    "ExecStart=/usr/bin/softverbs daemon --config /etc/softverbs/softverbs.toml"
                )
        );
        let p = d.0.join(name);
        std::fs::write(&p, text.replace("/usr/bin/softverbs", BIN)).unwrap();
        units.push(p);
    }
    // --man=no: the units name the package's man page (Documentation=), which is installed
    // only with the package (scripts/deb-test.sh checks it there).
    let o = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(&units)
        .output()
        .expect("systemd-analyze (Debian package systemd)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success() && said.trim().is_empty(), "{said}");

    let socket = std::fs::read_to_string(dist.join("softverbs.socket")).unwrap();
    let path = socket
        .lines()
        .find_map(|l| l.strip_prefix("ListenSequentialPacket="))
        .expect("a SOCK_SEQPACKET socket");
    // Where a client of root with no XDG_RUNTIME_DIR looks: `status` names it, whether a
    // daemon answers there or not.
    let o = Command::new(BIN)
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("SOFTVERBS_SOCKET")
        .env("SOFTVERBS_AUTOSTART", "0")
        .arg("status")
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(said.contains(&format!(" {path}")), "{path} vs {said}");
}

/// A device named by a real interface takes its addresses, IPv4 first, and not its IPv6
/// link-local one; `mtu` lowers what the link allows but never raises it. The daemon runs in
/// a network namespace of its own, on a veth interface made there (root only).
#[test]
fn a_device_named_by_interface_takes_its_addresses() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: making an interface needs root");
        return;
    }
    let d = dir("iface");
    let socket = d.0.join("s.sock");
    let status = |config: &str| -> Value {
        let file = d.0.join("softverbs.toml");
        write_config(&file, config);
        // `unshare` and `sh` exec: the child is the daemon. /sys shows the namespace's links
        // once mounted there (as `ip netns exec` does). nodad: the IPv6 address is usable at
        // once. A veth link's MTU is 1500, which fits IB MTU 1024.
        let mut daemon = Command::new("unshare")
            .args(["--net", "--mount", "--", "sh", "-c"])
            .arg(
                "set -e; mount -t sysfs sysfs /sys; ip link set lo up; ip addr add 192.0.2.77/32 dev lo; ip link add svveth0 type veth peer name svveth1; \
                 ip addr add 2001:db8::5/64 dev svveth0 nodad; \
                 ip addr add 192.0.2.5/24 dev svveth0; \
                 ip link set svveth0 up; ip link set svveth1 up; \
                 exec \"$0\" --socket \"$1\" daemon --config \"$2\"",
            )
            .arg(BIN)
            .arg(&socket)
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.0.join("daemon.log")).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + WAIT;
        let s = loop {
            let o = Command::new(BIN)
                .arg("--socket")
                .arg(&socket)
                .args(["status", "--json"])
                .output()
                .unwrap();
            if o.status.success() {
                break serde_json::from_slice::<Value>(&o.stdout).unwrap();
            }
            let log = std::fs::read_to_string(d.0.join("daemon.log")).unwrap_or_default();
            assert!(
                Instant::now() < deadline && daemon.try_wait().unwrap().is_none(),
                "the daemon did not answer; log:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&daemon),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        daemon.wait().unwrap();
        s["device_status"][0]["ports"][0].clone()
    };

    let port = status("[devices]\nsoftverbs0 = \"svveth0\"\n");
    assert_eq!(
        port["addrs"],
        serde_json::json!(["192.0.2.5", "2001:db8::5"]),
        "IPv4 first, no fe80::"
    );
    assert_eq!(port["active_mtu"], 1024, "what a 1500-byte link fits");
    let port = status("mtu = 512\n[devices]\nsoftverbs0 = [\"svveth0\", \"192.0.2.77\"]\n");
    assert_eq!(
        port["addrs"],
        serde_json::json!(["192.0.2.5", "2001:db8::5", "192.0.2.77"])
    );
    assert_eq!(port["active_mtu"], 512);
    let port = status("mtu = 4096\n[devices]\nsoftverbs0 = \"svveth0\"\n");
    assert_eq!(
        port["active_mtu"], 1024,
        "mtu never raises what the link allows"
    );
}

/// sd_listen_fds(3)'s rules: variables meant for another process (`LISTEN_PID` not ours) are
/// not ours to take: the daemon binds its own socket; two passed sockets are refused, since
/// the daemon serves one.
#[test]
fn activation_variables_for_another_process_or_two_sockets_are_not_taken() {
    let d = dir("listen-pid");
    let socket = d.0.join("own.sock");
    let mut daemon = Command::new(BIN)
        .arg("--socket")
        .arg(&socket)
        .args(["daemon", "--no-network"])
        // pid 1 is never this daemon.
        .env("LISTEN_PID", "1")
        .env("LISTEN_FDS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + WAIT;
    let s: Value = loop {
        let o = Command::new(BIN)
            .arg("--socket")
            .arg(&socket)
            .args(["status", "--json"])
            .output()
            .unwrap();
        if o.status.success() {
            break serde_json::from_slice(&o.stdout).unwrap();
        }
        assert!(
            Instant::now() < deadline && daemon.try_wait().unwrap().is_none(),
            "the daemon did not bind its own socket"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(s["daemon_pid"], daemon.id());
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&daemon),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert!(daemon.wait().unwrap().success());

    let d = dir("two-sockets");
    let log = d.0.join("daemon.log");
    let mut activator = Command::new("systemd-socket-activate")
        .arg("--seqpacket")
        .arg("--listen")
        .arg(d.0.join("a.sock"))
        .arg("--listen")
        .arg(d.0.join("b.sock"))
        .arg(BIN)
        .args(["daemon", "--no-network"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("systemd-socket-activate (Debian package systemd)");
    let deadline = Instant::now() + WAIT;
    while !d.0.join("a.sock").exists() {
        assert!(Instant::now() < deadline, "no socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The first connection starts the daemon, which refuses and exits.
    let o = Command::new(BIN)
        .arg("--socket")
        .arg(d.0.join("a.sock"))
        .arg("status")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(!activator.wait().unwrap().success());
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("2 sockets passed"), "{said}");
}
