//! A daemon that plays a NIC must have its NIC: `softverbs daemon` whose device address is
//! taken by another daemon (`EADDRINUSE`) or is on no interface of this host
//! (`EADDRNOTAVAIL`) exits non-zero at start-up, naming the device, the address and the
//! error, before any client can connect; `softverbs run` and `softverbs demo`, whose daemon
//! autostarts, say why it did not come up. And `softverbs status` shows each device's
//! ports (addresses, active MTU) and the multicast groups it joined with their QPs.
//!
//! Run inside a network namespace of their own (`unshare -n`), as every test that binds
//! RoCE ports must be on a shared machine.

use std::net::{Ipv4Addr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use softverbs::{Context, Gid, QpCap, QpInit, QpType};
use softverbs_testkit::Daemon;

const BIN: &str = env!("CARGO_BIN_EXE_softverbs");

/// How long a failing daemon may take to exit: it fails before serving, so this is only a
/// bound against a hang, never a measurement.
const EXIT_WAIT: Duration = Duration::from_secs(10);

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(name: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("svnet-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Dir(d)
}

/// `softverbs daemon --socket SOCKET --device NAME=IP`, waited for with a bound: it must
/// exit by itself.
fn daemon_that_exits(socket: &Path, device: &str) -> Output {
    let mut child = Command::new(BIN)
        .arg("--socket")
        .arg(socket)
        .args(["daemon", "--device", device])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + EXIT_WAIT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "the daemon for {device} kept running: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// An address of the pid's own in 127/8, so test executables never share one.
fn loopback(host: u8) -> String {
    let pid = std::process::id();
    format!("127.{}.{}.{host}", 200 + (pid >> 8) % 50, pid & 0xff)
}

#[test]
fn a_second_daemon_on_a_taken_address_fails_at_start_and_says_why() {
    let ip = loopback(1);
    let first = Daemon::options("first")
        .bin(BIN)
        .device("softverbs0", &ip)
        .start();
    let d = dir("taken");
    let socket = d.0.join("second.sock");
    let out = daemon_that_exits(&socket, &format!("sv-second={ip}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("device sv-second"), "{err}");
    assert!(err.contains(&format!("{ip}:4791")), "{err}");
    assert!(err.contains("EADDRINUSE"), "{err}");
    assert!(!socket.exists(), "it never served a socket");
    // The first daemon plays its NIC on as before.
    assert!(first.answers());
}

#[test]
fn a_daemon_on_an_address_of_no_interface_fails_with_eaddrnotavail() {
    // TEST-NET-1 (RFC 5737): documentation only, on no interface of any host.
    let d = dir("absent");
    let socket = d.0.join("sv.sock");
    let out = daemon_that_exits(&socket, "sv-absent=192.0.2.77");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("device sv-absent"), "{err}");
    assert!(err.contains("192.0.2.77:4791"), "{err}");
    assert!(err.contains("EADDRNOTAVAIL"), "{err}");
    assert!(!socket.exists(), "it never served a socket");
    // Without network the same device starts (its clients meet through it alone).
    let nonet = Daemon::options("absent-nonet")
        .bin(BIN)
        .args(&["--device", "sv-absent=192.0.2.77"])
        .start();
    assert!(nonet.answers());
}

#[test]
fn run_and_demo_report_why_their_autostarted_daemon_did_not_start() {
    // An autostarted daemon takes an address of its own when another daemon holds the
    // default one (multi_user.rs), but a device named to `run --device` is taken as named:
    // hold its RoCE port (already held by someone else is as good).
    let ip = loopback(3);
    let _held = UdpSocket::bind((ip.parse::<Ipv4Addr>().unwrap(), 4791));
    let d = dir("autostart");
    // `run` needs a drop-in library to put on the path; the daemon fails before it matters.
    let lib = d.0.join("libibverbs.so.1");
    std::fs::write(&lib, b"").unwrap();
    let socket = d.0.join("run").join("sv.sock");
    let cli = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = Command::new(BIN);
        c.arg("--socket")
            .arg(&socket)
            .args(args)
            .env_remove("SOFTVERBS_AUTOSTART")
            .env_remove("SOFTVERBS_IDLE_EXIT")
            .env("SOFTVERBS_DAEMON_BIN", BIN)
            .env("SOFTVERBS_LIBIBVERBS", &lib)
            .stdin(Stdio::null());
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let start = Instant::now();
    let dev = format!("softverbs0={ip}");
    let out = cli(&["run", "--device", &dev, "--", "/bin/true"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{err}");
    assert!(err.contains("device softverbs0"), "{err}");
    assert!(err.contains(&format!("{ip}:4791")), "{err}");
    assert!(err.contains("EADDRINUSE"), "{err}");
    assert!(start.elapsed() < EXIT_WAIT, "it did not wait out a timeout");

    // The demo's daemon, refusing a bad idle time, says why too.
    let out = cli(
        &["demo", "--workers", "1"],
        &[("SOFTVERBS_IDLE_EXIT", "soon")],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("softverbs demo FAILED"), "{err}");
    assert!(err.contains("SOFTVERBS_IDLE_EXIT=soon"), "{err}");
}

#[test]
fn status_shows_each_devices_port_mtu_and_its_multicast_groups() {
    let d = Daemon::options("status-mcast")
        .bin(BIN)
        .device("sv-mc", &loopback(2))
        .start();
    let ctx = Context::open_at(&d.socket, 0).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let cap = QpCap {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let ud = || {
        ctx.create_qp(&QpInit::new(QpType::Ud, &pd).cqs(&cq, &cq).cap(cap))
            .unwrap()
    };
    let (a, b) = (ud(), ud());
    let (g1, g2) = (Ipv4Addr::new(239, 7, 1, 1), Ipv4Addr::new(239, 7, 1, 2));
    a.attach_mcast(Gid::from(g1)).unwrap();
    b.attach_mcast(Gid::from(g1)).unwrap();
    a.attach_mcast(Gid::from(g2)).unwrap();

    let text = d.cli(&["status"]);
    let line = |needle: &str| {
        text.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} line in:\n{text}"))
            .to_string()
    };
    // Loopback's MTU (65536) carries IB's largest MTU.
    let port = line("device sv-mc port 1:");
    assert!(port.contains("active MTU 4096"), "{port}");
    assert!(port.contains(&loopback(2)), "{port}");
    let one = line("multicast group 239.7.1.1:");
    assert!(one.contains("2 QPs attached"), "{one}");
    assert!(one.contains("joined on the network"), "{one}");
    assert!(line("multicast group 239.7.1.2:").contains("1 QP attached"));

    let v = d.status();
    let dev = &v["device_status"][0];
    assert_eq!(dev["name"], "sv-mc", "{v}");
    assert_eq!(dev["ports"][0]["active_mtu"], 4096, "{v}");
    let groups = dev["mcast_groups"].as_array().unwrap();
    let summary: Vec<(String, u64, bool)> = groups
        .iter()
        .map(|g| {
            (
                g["group"].as_str().unwrap().to_string(),
                g["qps"].as_u64().unwrap(),
                g["net_joined"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("239.7.1.1".to_string(), 2, true),
            ("239.7.1.2".to_string(), 1, true)
        ],
        "{v}"
    );

    // Leaving: the group goes with its last QP.
    a.detach_mcast(Gid::from(g2)).unwrap();
    let text = d.cli(&["status"]);
    assert!(!text.contains("239.7.1.2"), "{text}");
    drop((a, b));
    let text = d.cli(&["status"]);
    assert!(
        text.contains("device sv-mc multicast groups: none"),
        "{text}"
    );
}

/// `softverbs daemon --autostarted` (what a client's autostart runs) on `socket`, kept
/// running (`--idle-exit 0`); waits until it answers and returns it with its `status` text.
fn autostarted(socket: &Path) -> (std::process::Child, String) {
    let mut child = Command::new(BIN)
        .arg("--socket")
        .arg(socket)
        .args(["daemon", "--autostarted", "--idle-exit", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + EXIT_WAIT;
    loop {
        let out = Command::new(BIN)
            .arg("--socket")
            .arg(socket)
            .arg("status")
            .output()
            .unwrap();
        if out.status.success() {
            return (child, String::from_utf8_lossy(&out.stdout).into_owned());
        }
        if let Some(st) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            panic!(
                "the daemon exited ({st}): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(Instant::now() < deadline, "the daemon never answered");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_autostarted_daemon_takes_an_address_of_its_own_or_none_and_says_so() {
    let d = dir("own-address");
    let socket = d.0.join("own.sock");
    let uid = rustix::process::geteuid().as_raw();
    let candidates = softverbs_daemon::config::own_addresses(uid, &socket);
    assert_eq!(candidates[0].to_string(), "127.0.0.1");
    // 127.0.0.1 and the first address of its own are another daemon's: it takes the next.
    let held: Vec<_> = candidates[..2]
        .iter()
        .map(|ip| UdpSocket::bind((*ip, 4791)))
        .collect();
    let (mut child, text) = autostarted(&socket);
    let want = format!(
        "network: UDP {}:4791, an address of its own: 127.0.0.1:4791, {}:4791 was taken",
        candidates[2], candidates[1]
    );
    assert!(text.contains(&want), "{want:?} in:\n{text}");
    assert!(
        text.contains(&format!(
            "device softverbs0 port 1: active MTU 4096 (max 4096), {}",
            candidates[2]
        )),
        "{text}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    drop(held);
    // Every address it would try is taken: it runs without a network, and says so.
    let held: Vec<_> = candidates
        .iter()
        .map(|ip| UdpSocket::bind((*ip, 4791)))
        .collect();
    let (mut child, text) = autostarted(&socket);
    assert!(
        text.contains("network: none: every address tried was taken"),
        "{text}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    drop(held);
}
