//! Per-access cost of the ways to reach client memory, and the one-time cost of sharing a
//! buffer in place. `cargo bench -p softverbs-memaccess --bench access`.
//!
//! The target is a child process (this binary re-run in a child role) holding a 1 MiB
//! buffer: a plain one for `process_mem` (`pread`/`pwrite` on its `/proc/<pid>/mem`, what
//! the daemon uses) and `process_vm` (`process_vm_readv`/`writev` by pid, the comparison),
//! one converted with `share_in_place` and mapped by the bench through `SharedMappings`
//! for `shared`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::{ChildProc, PageBuf};
use criterion::{BatchSize, BenchmarkId, Criterion, Throughput};
use softverbs_core::ids::CtxId;
use softverbs_core::memory::{AtomicOp, Memory};
use softverbs_memaccess::{share_in_place, ProcessMem, ProcessMemory, ProcessVm, SharedMappings};

const CTX: CtxId = CtxId(1);
const SIZES: [usize; 5] = [8, 64, 4 << 10, 64 << 10, 1 << 20];
const BUF: usize = 1 << 20;

fn label(n: usize) -> String {
    match n {
        n if n >= 1 << 20 => format!("{}MiB", n >> 20),
        n if n >= 1 << 10 => format!("{}KiB", n >> 10),
        n => format!("{n}B"),
    }
}

fn bench_access(c: &mut Criterion, plain: &ChildProc, shared: &ChildProc) {
    let mut pv = ProcessVm::new();
    pv.register_process(CTX, plain.pid);
    // One system call per access, as these groups have always measured.
    let mut pm = ProcessMem::new().with_batching(false);
    let mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{}/mem", plain.pid))
        .unwrap();
    pm.register_process(
        CTX,
        ProcessMemory::validate(mem.into(), plain.pid as u32).unwrap(),
    );
    let mut shm = SharedMappings::new();
    shm.add_region(CTX, shared.addr, BUF as u64, shared.open_memfd())
        .unwrap();
    let mut buf = vec![0u8; BUF];
    let data = vec![0x5au8; BUF];

    for (op, is_write) in [("read", false), ("write", true)] {
        let mut g = c.benchmark_group(op);
        for n in SIZES {
            g.throughput(Throughput::Bytes(n as u64));
            g.bench_function(BenchmarkId::new("process_mem", label(n)), |b| {
                b.iter(|| {
                    if is_write {
                        pm.write(CTX, plain.addr, &data[..n]).unwrap()
                    } else {
                        pm.read(CTX, plain.addr, &mut buf[..n]).unwrap()
                    }
                })
            });
            g.bench_function(BenchmarkId::new("process_vm", label(n)), |b| {
                b.iter(|| {
                    if is_write {
                        pv.write(CTX, plain.addr, &data[..n]).unwrap()
                    } else {
                        pv.read(CTX, plain.addr, &mut buf[..n]).unwrap()
                    }
                })
            });
            g.bench_function(BenchmarkId::new("shared", label(n)), |b| {
                b.iter(|| {
                    if is_write {
                        shm.write(CTX, shared.addr, &data[..n]).unwrap()
                    } else {
                        shm.read(CTX, shared.addr, &mut buf[..n]).unwrap()
                    }
                })
            });
        }
        g.finish();
    }

    let mut g = c.benchmark_group("atomic");
    let add = AtomicOp::FetchAdd { add: 1 };
    g.bench_function("process_mem_rmw", |b| {
        b.iter(|| pm.atomic(CTX, plain.addr, add).unwrap())
    });
    g.bench_function("process_vm_rmw", |b| {
        b.iter(|| pv.atomic(CTX, plain.addr, add).unwrap())
    });
    g.bench_function("shared_cpu", |b| {
        b.iter(|| shm.atomic(CTX, shared.addr, add).unwrap())
    });
    g.finish();
}

/// A 64 KiB and a 1 MiB message moved as the engine moves them, 4 KiB packets one by one:
/// per packet (`per_packet`), and batched (`batched`: the engine's hint and one read per
/// window; writes held back and flushed once per message).
fn bench_messages(c: &mut Criterion, plain: &ChildProc) {
    let open = || -> ProcessMemory {
        let mem = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{}/mem", plain.pid))
            .unwrap();
        ProcessMemory::validate(mem.into(), plain.pid as u32).unwrap()
    };
    let mut one = ProcessMem::new().with_batching(false);
    one.register_process(CTX, open());
    let mut batched = ProcessMem::new();
    batched.register_process(CTX, open());
    let mut pkt = vec![0u8; 4096];
    for (op, is_write) in [("message_read", false), ("message_write", true)] {
        let mut g = c.benchmark_group(op);
        for n in [64 << 10, 1 << 20] {
            g.throughput(Throughput::Bytes(n as u64));
            for (name, pm) in [("per_packet", &mut one), ("batched", &mut batched)] {
                g.bench_function(BenchmarkId::new(name, label(n)), |b| {
                    b.iter(|| {
                        if !is_write {
                            pm.will_read(false, CTX, plain.addr, n as u64);
                        }
                        for at in (0..n).step_by(4096) {
                            let a = plain.addr + at as u64;
                            if is_write {
                                pm.write(CTX, a, &pkt).unwrap();
                            } else {
                                pm.read(CTX, a, &mut pkt).unwrap();
                            }
                        }
                        pm.flush().unwrap();
                    })
                });
            }
        }
        g.finish();
    }
}

fn bench_share(c: &mut Criterion) {
    let mut g = c.benchmark_group("share_in_place");
    for n in [4 << 10, 64 << 10, 1 << 20] {
        g.throughput(Throughput::Bytes(n as u64));
        g.bench_function(label(n), |b| {
            b.iter_batched(
                || {
                    // An application buffer with data in it (pages already faulted in).
                    let buf = PageBuf::new(n);
                    for i in (0..n).step_by(64) {
                        buf.set(i, i as u8);
                    }
                    buf
                },
                |buf| {
                    let fd = share_in_place(buf.addr(), n).unwrap();
                    (buf, fd) // Dropped (munmap, close) outside the timing.
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

fn main() {
    common::run_child_if_requested();
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
        .configure_from_args();
    let plain = ChildProc::spawn("plain", BUF, &[]);
    let shared = ChildProc::spawn("shared", BUF, &[]);
    bench_access(&mut c, &plain, &shared);
    bench_messages(&mut c, &plain);
    bench_share(&mut c);
    c.final_summary();
}
