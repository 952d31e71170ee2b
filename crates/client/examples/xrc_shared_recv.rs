//! An XRC receive QP shared by several processes, through the upstream face: the domain is
//! named by a file (`ibv_open_xrcd(3)` with `O_CREAT`), the receive QP is created once and
//! opened by number in the other processes (`ibv_open_qp(3)`), and each `XrcRecvQp` is a
//! handle that closes on drop. The QP lives while any process holds a handle, survives the
//! process that created it, and disappears with the last handle
//! (`docs/design/xrc-semantics.md`).
//!
//!     cargo run -p softverbs --example xrc_shared_recv
//!
//! The parent starts two copies of itself as holders, drops its own handle, and shows that
//! the QP lives on in them and goes away when they exit.

#[path = "common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};

use softverbs::{Context, O_CREAT};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("holder") {
        return holder(&args[2], &args[3], args[4].parse()?);
    }
    let d = common::daemon("xrc");
    let domain = std::env::temp_dir().join(format!("softverbs-xrc-{}", std::process::id()));
    let file = std::fs::File::create(&domain)?;
    let ctx = Context::open_at(&d.socket, 0)?;
    let xrcd = ctx.open_xrcd(Some(&file), O_CREAT)?;
    let rq = xrcd.create_recv_qp()?;
    let qpn = rq.qpn();
    println!(
        "parent: created XRC receive QP {qpn:#x} in domain {}",
        domain.display()
    );

    let mut holders: Vec<(Child, BufReader<std::process::ChildStdout>)> = Vec::new();
    for _ in 0..2 {
        let mut c = Command::new(std::env::current_exe()?)
            .args([
                "holder",
                &d.socket.display().to_string(),
                &domain.display().to_string(),
            ])
            .arg(qpn.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut out = BufReader::new(c.stdout.take().ok_or("stdout")?);
        let mut line = String::new();
        out.read_line(&mut line)?;
        print!("holder {}: {line}", c.id());
        holders.push((c, out));
    }

    // The creator lets go: the QP stays, because the holders have it open.
    drop(rq);
    let again = xrcd.open_recv_qp(qpn)?;
    println!(
        "parent: dropped its handle; the QP is still there ({:?})",
        again.query()?.attr.qp_state
    );
    drop(again);

    // The holders exit (each handle closes); with the last one the QP is gone.
    for (mut c, _) in holders {
        writeln!(c.stdin.take().ok_or("stdin")?, "exit")?;
        c.wait()?;
    }
    match xrcd.open_recv_qp(qpn) {
        Err(e) => println!("parent: after the last holder left, opening it fails: {e}"),
        Ok(_) => return Err("the QP outlived every holder".into()),
    }
    let _ = std::fs::remove_file(&domain);
    Ok(())
}

/// A second process: opens the same domain by its file and the QP by its number, says so,
/// and holds it until told to exit.
fn holder(socket: &str, domain: &str, qpn: u32) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::open_at(std::path::Path::new(socket), 0)?;
    let file = std::fs::File::open(domain)?;
    let xrcd = ctx.open_xrcd(Some(&file), 0)?;
    let rq = xrcd.open_recv_qp(qpn)?;
    println!(
        "opened QP {:#x}, state {:?}",
        rq.qpn(),
        rq.query()?.attr.qp_state
    );
    std::io::stdout().flush()?;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    Ok(())
}
