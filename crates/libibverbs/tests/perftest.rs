//! Debian's perftest (`ib_send_lat`, `ib_send_bw`, `ib_write_lat`, `ib_write_bw`,
//! `ib_read_bw`) unmodified on the drop-in `libibverbs.so.1`, started with `softverbs run`:
//! server and client as two processes on one daemon, and the bandwidth tests across two daemons
//! talking RoCE v2 over loopback UDP, plus `ib_send_bw -a` (every size to 8 MiB). Each run must
//! exit 0 on both sides and print a result line for every message size it ran, which is what
//! a user reads off perftest; the numbers themselves decide nothing (a bandwidth of tiny
//! messages rounds to 0.00 MB/s on a loaded machine; docs/performance.md has the figures).
//!
//! Skipped (with a message) only when perftest is not installed. The `softverbs` binary must be
//! built in the same profile (`cargo build -p softverbs-cli`): this crate cannot depend on it.

mod support;

use support::{finish, free_port, have, text, Daemon};

/// Loopback addresses of this test process: 127.A.B.x from the pid, away from the ranges the
/// CLI tests and utils.rs use (127.93.*) and from hand-started daemons (127.0.*).
fn addr(test: u8, host: u8) -> String {
    let pid = std::process::id();
    format!(
        "127.{}.{}.{}",
        128 + (pid >> 8) % 100,
        pid & 0xff,
        test * 4 + host
    )
}

/// The message sizes of perftest's result table (the lines after the `#bytes` header).
fn sizes(out: &str) -> Vec<u64> {
    out.lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"))
        .skip(1)
        .map_while(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .collect()
}

/// The values perftest's result table gives in `column` (0-based), one per message size (the
/// lines after the `#bytes` header): bandwidth average for `_bw`, typical latency for `_lat`.
fn results(out: &str, column: usize) -> Vec<f64> {
    out.lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"))
        .skip(1)
        .map_while(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.first()?.parse::<u64>().ok()?;
            cols.get(column)?.parse::<f64>().ok()
        })
        .collect()
}

/// The sizes a run with `extra` reports: `-a` every power of two from 2 B to 8 MiB, else `-s`.
fn expected_sizes(extra: &[&str]) -> Vec<u64> {
    if extra.contains(&"-a") {
        return (1..24).map(|i| 1u64 << i).collect();
    }
    let s = extra.iter().position(|a| *a == "-s").expect("-s or -a");
    vec![extra[s + 1].parse().expect("a size")]
}

/// Runs `prog` as a server on `srv` and as its client on `cli` (the same daemon or another),
/// both on GID index 0 (RoCE v2), and checks both exits and result lines.
fn perftest(srv: &Daemon, cli: &Daemon, prog: &str, extra: &[&str]) {
    let port = free_port();
    let p = port.to_string();
    let mut args = vec!["-d", "softverbs0", "-x", "0", "-p", &p];
    args.extend_from_slice(extra);
    let mut server = srv.spawn_server(prog, &args, port);
    args.push("localhost");
    let client = cli.spawn(prog, &args);
    let co = finish(client, &format!("{prog} client"));
    if !co.status.success() {
        // The server would wait for the rest of a transfer that never comes: what the client
        // said is the failure.
        let _ = server.kill();
        let so = server.wait_with_output().expect("wait");
        panic!(
            "{prog} {extra:?} client: {}\nserver (killed): {}\ndaemon log:\n{}",
            text(&co),
            text(&so),
            cli.log()
        );
    }
    let so = finish(server, &format!("{prog} server"));
    // `_bw`: "#bytes #iterations BW-peak BW-average MsgRate"; `_lat`: "#bytes #iterations
    // t_min t_max t_typical …".
    let column = if prog.ends_with("_bw") { 3 } else { 4 };
    for (side, o, d) in [("client", &co, cli), ("server", &so, srv)] {
        assert!(
            o.status.success(),
            "{prog} {extra:?} {side}: {}\ndaemon log:\n{}",
            text(o),
            d.log()
        );
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(
            sizes(&out),
            expected_sizes(extra),
            "{prog} {extra:?} {side}: not a result line for every size: {}",
            text(o)
        );
        // The figures only go to the log: timings never decide a test.
        eprintln!("{prog} {extra:?} {side}: {:?}", results(&out, column));
    }
}

#[test]
fn perftest_between_two_processes_on_one_daemon() {
    if !have("ib_send_lat", "perftest") {
        return;
    }
    let d = Daemon::start_with_ip("one", &addr(0, 1));
    perftest(&d, &d, "ib_send_lat", &["-n", "200", "-s", "8"]);
    perftest(&d, &d, "ib_write_lat", &["-n", "200", "-s", "8"]);
    perftest(&d, &d, "ib_send_bw", &["-n", "200", "-s", "4096"]);
    perftest(&d, &d, "ib_write_bw", &["-n", "200", "-s", "65536"]);
    perftest(&d, &d, "ib_read_bw", &["-n", "200", "-s", "65536"]);
    // Every size from 2 B to 8 MiB on one pair of QPs, with perftest's CQ moderation of 100
    // at every size (-a keeps it): requests as long as the send window and longer.
    perftest(&d, &d, "ib_send_bw", &["-a", "-n", "20"]);
}

#[test]
fn perftest_bandwidth_between_two_daemons_over_udp() {
    if !have("ib_send_lat", "perftest") {
        return;
    }
    let a = Daemon::start_with_ip("a", &addr(1, 1));
    let b = Daemon::start_with_ip("b", &addr(1, 2));
    perftest(&a, &b, "ib_send_bw", &["-n", "200", "-s", "4096"]);
    perftest(&a, &b, "ib_write_bw", &["-n", "200", "-s", "65536"]);
}

#[test]
fn result_lines_are_parsed() {
    let bw = "---\n #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n 65536      1000             477.22             449.90 \t\t   0.007198\n---";
    assert_eq!(results(bw, 3), vec![449.90]);
    let lat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]\n 2       1000          10.42          59.57        18.49    \t       19.39\n";
    assert_eq!(results(lat, 4), vec![18.49]);
    let all = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n 2          20               0.09               0.09   \t\t   0.047\n 8388608    20               654.11             654.11 \t\t   0.000082\n Failed status 12: wr_id 0 syndrom 0x0\n";
    assert_eq!(results(all, 3), vec![0.09, 654.11]);
    assert_eq!(sizes(all), vec![2, 8388608]);
    assert!(results("nothing", 3).is_empty());
    assert!(sizes("nothing").is_empty());
    assert_eq!(expected_sizes(&["-a", "-n", "20"]).len(), 23);
    assert_eq!(expected_sizes(&["-n", "200", "-s", "8"]), vec![8]);
}
