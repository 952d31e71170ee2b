//! Unmodified rdmacm-utils and perftest `-R` between two daemons, each in a network
//! namespace of its own (`sv1?a`/`sv1?b`, joined by veth, made and removed by each test),
//! over IPv4, over IPv6 and with devices that have both; and on one daemon whose device has
//! an IPv4 and an IPv6 address.
//! Every program runs through `softverbs run` with this build's drop-ins; after each, both
//! daemons' CMs hold nothing (`resources --json`, key `cm`).
//!
//! Skipped (with a message) when the programs are missing; the namespace tests also need
//! root and `ip` (CI has all). Build first: `cargo build -p softverbs-cli -p
//! softverbs-libibverbs -p softverbs-librdmacm`.

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use softverbs_testkit::bins::softverbs_bin;
use softverbs_testkit::process::finish;
use softverbs_testkit::Daemon;
use support::{cm_of, have, ok, run, wait_cm, Netns};

fn cm_empty(cm: &serde_json::Value) -> bool {
    ["listeners", "connections", "time_wait", "owned"]
        .iter()
        .all(|k| cm[k] == 0)
}

fn root() -> bool {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc_getuid() } == 0 {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "CI runs as root");
    eprintln!("SKIP: network namespaces need root");
    false
}

unsafe extern "C" {
    #[link_name = "getuid"]
    fn libc_getuid() -> u32;
}

/// Which addresses the hosts' devices have.
#[derive(Clone, Copy, PartialEq)]
enum Addrs {
    V4,
    V6,
    /// IPv4 first, then IPv6.
    Both,
}

/// Host `a` (10.`net`.0.1, and fd00:5f1:`net`::1 unless `V4`) and host `b` (.2, ::2),
/// each with a daemon whose one device `softverbs0` has the host's addresses of `Addrs`,
/// capturing its traffic. Daemons go on drop, then the namespaces.
struct Hosts {
    a: (Child, PathBuf),
    b: (Child, PathBuf),
    dir: PathBuf,
    /// The hosts' addresses: IPv6 for `V6`, IPv4 otherwise.
    ips: [String; 2],
    v6: [String; 2],
    prefix: &'static str,
    // Dropped last: the daemons are gone by then.
    _ns: Netns,
}

impl Hosts {
    fn up(prefix: &'static str, net: u8, addrs: Addrs) -> Hosts {
        let ns = Netns::up(prefix, net)
            .unwrap_or_else(|| panic!("could not create the {prefix}a/{prefix}b namespaces"));
        let v4 = [format!("10.{net}.0.1"), format!("10.{net}.0.2")];
        let v6 = if addrs != Addrs::V4 {
            for (h, n) in [("a", 1), ("b", 2)] {
                // `nodad`: usable at once, not after duplicate address detection.
                let s = Command::new("ip")
                    .args(["-n", &format!("{prefix}{h}"), "-6", "addr", "add"])
                    .arg(format!("fd00:5f1:{net}::{n}/64"))
                    .args(["dev", &format!("{prefix}{h}0"), "nodad"])
                    .status()
                    .unwrap();
                assert!(s.success(), "ip -6 addr add in {prefix}{h}");
            }
            [format!("fd00:5f1:{net}::1"), format!("fd00:5f1:{net}::2")]
        } else {
            [String::new(), String::new()]
        };
        let (ips, devs) = match addrs {
            Addrs::V4 => (v4.clone(), v4),
            Addrs::V6 => (v6.clone(), v6.clone()),
            Addrs::Both => (v4.clone(), [0, 1].map(|k| format!("{},{}", v4[k], v6[k]))),
        };
        let dir = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let daemon = |h: &str, ip: &str| {
            let ns = format!("{prefix}{h}");
            let sock = dir.join(format!("{h}.sock"));
            let cap = dir.join(format!("cap-{h}"));
            std::fs::create_dir_all(&cap).unwrap();
            let child = Command::new("ip")
                .args(["netns", "exec", &ns])
                .arg(softverbs_bin())
                .arg("daemon")
                .arg("--socket")
                .arg(&sock)
                .arg("--device")
                .arg(format!("softverbs0={ip}"))
                .arg("--capture")
                .arg(&cap)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.join(format!("{h}.log"))).unwrap())
                .spawn()
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(20);
            while !cm_of(&sock).is_object() {
                assert!(Instant::now() < deadline, "daemon in {ns} did not start");
                std::thread::sleep(Duration::from_millis(20));
            }
            (child, sock)
        };
        let a = daemon("a", &devs[0]);
        let b = daemon("b", &devs[1]);
        Hosts {
            a,
            b,
            dir,
            ips,
            v6,
            prefix,
            _ns: ns,
        }
    }

    fn ns(&self, h: char) -> String {
        format!("{}{h}", self.prefix)
    }

    /// Runs server `s` on host a and, once it listens, client `c` on host b; both must
    /// succeed. Returns their outputs; then waits until both daemons hold no CM state.
    fn pair(&self, s: (&str, &[&str]), c: (&str, &[&str])) -> (String, String) {
        let (na, nb) = (self.ns('a'), self.ns('b'));
        let server = run(Some(&na), &self.a.1, s.0, s.1);
        wait_cm(&self.a.1, "server listening", |cm| cm["listeners"] != 0);
        let client = finish(run(Some(&nb), &self.b.1, c.0, c.1), c.0);
        let server = finish(server, s.0);
        let out = (ok(server, s.0), ok(client, c.0));
        self.empty();
        out
    }

    fn empty(&self) {
        wait_cm(&self.a.1, "nothing left on the server's daemon", cm_empty);
        wait_cm(&self.b.1, "nothing left on the client's daemon", cm_empty);
    }

    fn server_ip(&self) -> &str {
        &self.ips[0]
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for (c, _) in [&mut self.a, &mut self.b] {
            let _ = c.kill();
            let _ = c.wait();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("daemon logs and captures kept in {}", self.dir.display());
        }
    }
}

#[test]
fn ucmatose_between_two_daemons() {
    if !have("ucmatose") || !root() {
        return;
    }
    let h = Hosts::up("sv1u", 111, Addrs::V4);
    let (srv, cli) = h.pair(
        ("ucmatose", &["-c", "2", "-C", "5"]),
        ("ucmatose", &["-s", h.server_ip(), "-c", "2", "-C", "5"]),
    );
    assert!(
        srv.contains("test complete") && cli.contains("test complete"),
        "{srv}\n{cli}"
    );
}

#[test]
fn udaddy_between_two_daemons() {
    if !have("udaddy") || !root() {
        return;
    }
    let h = Hosts::up("sv1d", 112, Addrs::V4);
    let (srv, cli) = h.pair(("udaddy", &[]), ("udaddy", &["-s", h.server_ip()]));
    assert!(srv.contains("data transfers complete"), "{srv}");
    assert!(cli.contains("data transfers complete"), "{cli}");
}

#[test]
fn rdma_server_and_client_between_two_daemons() {
    if !have("rdma_server") || !root() {
        return;
    }
    let h = Hosts::up("sv1r", 113, Addrs::V4);
    let (srv, cli) = h.pair(
        ("rdma_server", &["-p", "7481"]),
        ("rdma_client", &["-s", h.server_ip(), "-p", "7481"]),
    );
    assert!(srv.contains("rdma_server: end 0"), "{srv}");
    assert!(cli.contains("rdma_client: end 0"), "{cli}");
}

/// perftest connecting through rdma_cm (`-R`) between two daemons: RC SEND bandwidth, RDMA
/// WRITE latency, and UD SEND bandwidth (SIDR resolves the server's QPN and Q_Key).
#[test]
fn perftest_with_rdma_cm_between_two_daemons() {
    if !have("ib_send_bw") || !have("ib_write_lat") || !root() {
        return;
    }
    let h = Hosts::up("sv1p", 114, Addrs::V4);
    for (prog, port, extra) in [
        ("ib_send_bw", "18611", &[][..]),
        ("ib_write_lat", "18612", &[]),
        ("ib_send_bw", "18613", &["-c", "UD"]),
    ] {
        let mut args = vec!["-R", "-d", "softverbs0", "-x", "0", "-n", "50", "-p", port];
        args.extend_from_slice(extra);
        let mut cargs = args.clone();
        cargs.push(h.server_ip());
        let (_, out) = h.pair((prog, &args), (prog, &cargs));
        assert!(out.contains("#bytes"), "{prog} {extra:?}: {out}");
    }
}

#[test]
fn rping_over_ipv6_between_two_daemons() {
    if !have("rping") || !root() {
        return;
    }
    let h = Hosts::up("sv16", 116, Addrs::V6);
    let ip = h.server_ip().to_string();
    let (_, out) = h.pair(
        ("rping", &["-s", "-v", "-a", &ip, "-p", "7482", "-C", "20"]),
        ("rping", &["-c", "-v", "-a", &ip, "-p", "7482", "-C", "20"]),
    );
    assert_eq!(out.matches("ping data: rdma-ping-").count(), 20, "{out}");
}

#[test]
fn ucmatose_over_ipv6_between_two_daemons() {
    if !have("ucmatose") || !root() {
        return;
    }
    let h = Hosts::up("sv17", 117, Addrs::V6);
    let ip = h.server_ip().to_string();
    let (srv, cli) = h.pair(
        ("ucmatose", &["-b", &ip, "-c", "2", "-C", "5"]),
        ("ucmatose", &["-s", &ip, "-c", "2", "-C", "5"]),
    );
    assert!(
        srv.contains("test complete") && cli.contains("test complete"),
        "{srv}\n{cli}"
    );
}

/// Two daemons whose devices have an IPv4 and an IPv6 address each (IPv4 first): rping -v
/// over either family and ucmatose over IPv6 (each address has its own UDP socket).
#[test]
fn dual_stack_devices_between_two_daemons() {
    if !have("rping") || !have("ucmatose") || !root() {
        return;
    }
    let h = Hosts::up("sv1b", 115, Addrs::Both);
    let v6 = h.v6[0].clone();
    for (ip, port) in [(v6.as_str(), "7485"), (h.server_ip(), "7486")] {
        let (_, out) = h.pair(
            ("rping", &["-s", "-v", "-a", ip, "-p", port, "-C", "10"]),
            ("rping", &["-c", "-v", "-a", ip, "-p", port, "-C", "10"]),
        );
        assert_eq!(
            out.matches("ping data: rdma-ping-").count(),
            10,
            "{ip}: {out}"
        );
    }
    let (srv, cli) = h.pair(
        ("ucmatose", &["-b", &v6, "-c", "2", "-C", "5"]),
        ("ucmatose", &["-s", &v6, "-c", "2", "-C", "5"]),
    );
    assert!(
        srv.contains("test complete") && cli.contains("test complete"),
        "{srv}\n{cli}"
    );
}

/// One daemon whose device has an IPv4 and an IPv6 address: rping connects over either,
/// and ucmatose over IPv6 (rdma_cm's address header then carries IPv6 addresses, and the
/// connection's GIDs are the IPv6 addresses, not the device's first GID).
#[test]
fn one_device_with_an_ipv4_and_an_ipv6_address() {
    if !have("rping") || !have("ucmatose") {
        return;
    }
    let d = Daemon::options("v4v6")
        .args(&["--device", "softverbs0=127.0.0.1,fd00:5f1:118::1"])
        .start();
    let at = d.socket.as_path();
    for (ip, port) in [("fd00:5f1:118::1", "7483"), ("127.0.0.1", "7484")] {
        let server = run(
            None,
            at,
            "rping",
            &["-s", "-v", "-a", ip, "-p", port, "-C", "10"],
        );
        wait_cm(at, "server listening", |cm| cm["listeners"] != 0);
        let client = finish(
            run(
                None,
                at,
                "rping",
                &["-c", "-v", "-a", ip, "-p", port, "-C", "10"],
            ),
            "rping -c",
        );
        let out = ok(client, &format!("rping -c over {ip}"));
        ok(finish(server, "rping -s"), &format!("rping -s over {ip}"));
        assert_eq!(out.matches("ping data: rdma-ping-").count(), 10, "{out}");
        wait_cm(at, "nothing left after rping", cm_empty);
    }
    let ip = "fd00:5f1:118::1";
    let server = run(None, at, "ucmatose", &["-b", ip, "-c", "2", "-C", "5"]);
    wait_cm(at, "ucmatose listening", |cm| cm["listeners"] != 0);
    let client = finish(
        run(None, at, "ucmatose", &["-s", ip, "-c", "2", "-C", "5"]),
        "ucmatose -s",
    );
    let cli = ok(client, "ucmatose client over IPv6");
    let srv = ok(finish(server, "ucmatose"), "ucmatose server over IPv6");
    assert!(
        srv.contains("test complete") && cli.contains("test complete"),
        "{srv}\n{cli}"
    );
    wait_cm(at, "nothing left after ucmatose", cm_empty);
}
