#!/usr/bin/env bash
# XRC's savings, measured (docs/guide/mpi.md, "XRC's savings, measured"): Open MPI's `mtl ofi` over
# libfabric `verbs;ofi_rxm` runs an all-to-all job (crates/e2e/tests/mpi/mpi_check.c) on a
# `softverbs cluster` of N ∈ {2, 4} hosts × P ∈ {1, 2, 4} ranks per host, over RC and over
# XRC. While every rank holds its connections (mpi_check's hold argument), the script reads
# each host's daemon (`softverbs resources --json`, `status --json`, /proc/PID/status): QPs by
# type, XRC receive QPs and their holders, XRC SRQs, the daemon's resident memory; rank 0
# reports the first all-to-all's time (which includes making the connections) and a second
# one's. Prints a Markdown table, checks every count against the formulas of
# crates/e2e/tests/cluster_ofi.rs, and writes an SVG bar chart.
#
# Opt-in (root, a few minutes): scripts/xrc-savings.sh [SVG-PATH]   (default
# docs/guide/mpi-xrc-savings.svg). SOFTVERBS names the binary (default target/debug/softverbs,
# built with `cargo build -p softverbs-cli -p softverbs-libibverbs -p softverbs-librdmacm`).
set -euo pipefail
cd "$(dirname "$0")/.."
exec /usr/bin/python3 - "${1:-docs/guide/mpi-xrc-savings.svg}" <<'PY'
import json, os, subprocess, sys, tempfile, threading

S = os.path.abspath(os.environ.get("SOFTVERBS", "target/debug/softverbs"))
SVG = sys.argv[1]
HOLD = "4"

def sh(*args, check=True):
    r = subprocess.run(args, capture_output=True, text=True, timeout=180)
    if check and r.returncode != 0:
        sys.exit(f"{' '.join(args)}: {r.stdout}{r.stderr}")
    return r.stdout

def formula(mode, n, p):
    """Per host: RC QPs, XRC send QPs, holders of each XRC receive QP, XRC SRQs."""
    if mode == "rc":
        return dict(rc=p * (n * p - 1), xrc_send=0, holders=[], srqs=0)
    local = p if p > 1 else 0
    return dict(rc=0, xrc_send=p * (n - 1) + local,
                holders=sorted([p] * (p * (n - 1)) + [p - 1] * local), srqs=p)

def host_state(name, i):
    sock = f"/run/softverbs/cluster/{name}/{name}-{i}/softverbs.sock"
    res = json.loads(sh(S, "--socket", sock, "resources", "--json"))
    st = json.loads(sh(S, "--socket", sock, "status", "--json"))
    rss = 0
    with open(f"/proc/{st['daemon_pid']}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return dict(
        rc=sum(q["qp_type"] == "Rc" for q in res["qps"]),
        xrc_send=sum(q["qp_type"] == "XrcSend" for q in res["qps"]),
        holders=sorted(len(x["holders"]) for x in res["xrc_recv_qps"]),
        srqs=sum(s.get("xrcd") is not None for s in res["srqs"]),
        rss_kib=rss,
    )

def job(name, n, p, mode, exe):
    d = f"/run/softverbs/cluster/{name}"
    idle = [host_state(name, i)["rss_kib"] for i in range(1, n + 1)]
    args = ["timeout", "--kill-after=5", "150", S, "cluster", "exec", f"{name}-1", "--",
            "mpirun", "--allow-run-as-root", "--oversubscribe", "--hostfile", f"{d}/hostfile",
            "-np", str(n * p), "--map-by", f"ppr:{p}:node", "--mca", "plm_rsh_agent",
            f"{d}/softverbs-rsh", "--mca", "pml", "cm", "--mca", "mtl", "ofi",
            "--mca", "mtl_ofi_provider_include", "verbs;ofi_rxm", "--mca", "osc", "pt2pt"]
    if mode == "xrc":
        # Every rank on the XRC domain: shared receive contexts, the XRC domain listed first
        # (docs/guide/mpi.md, "Over XRC").
        args += ["-x", "FI_OFI_RXM_USE_SRX=1", "-x", "FI_VERBS_PREFER_XRC=1"]
    args += [exe, "10", HOLD]
    # A session of its own: a job that hangs is killed whole (mpirun, orted and the ranks).
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines, ready = [], threading.Event()
    def read():
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("mpi_check OK"):
                ready.set()
        ready.set()  # the job ended (without the line, it failed)
    t = threading.Thread(target=read)
    t.start()
    failed = dict(n=n, p=p, mode=mode, failed=True)
    if not ready.wait(150) or not any(l.startswith("mpi_check OK") for l in lines):
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        proc.wait()
        t.join()
        print(f"N={n} P={p} {mode}: no result\n{''.join(lines)}", file=sys.stderr)
        return failed
    hosts = [host_state(name, i) for i in range(1, n + 1)]
    rc = proc.wait()
    t.join()
    out = "".join(lines)
    if rc != 0:
        print(f"N={n} P={p} {mode}: exit {rc}\n{out}", file=sys.stderr)
        return failed
    first = again = float("nan")
    for line in lines:
        if line.startswith("alltoall "):
            kv = dict(w.split("=") for w in line.split()[1:])
            first, again = float(kv["first_ms"]), float(kv["again_ms"])
    want = formula(mode, n, p)
    ok = all({k: h[k] for k in want} == want for h in hosts)
    return dict(n=n, p=p, mode=mode, hosts=hosts, idle_kib=idle, first_ms=first,
                again_ms=again, formula=want, ok=ok, failed=False)

def holders_text(hs):
    if not hs:
        return "—"
    return ", ".join(f"{hs.count(k)}×{k}" for k in sorted(set(hs), reverse=True))

def span(vals, fmt="{}"):
    lo, hi = min(vals), max(vals)
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}–{fmt.format(hi)}"

def svg(results, path):
    by = {(r["n"], r["p"], r["mode"]): r for r in results}
    combos = [(r["n"], r["p"]) for r in results
              if r["mode"] == "rc" and (r["n"], r["p"], "xrc") in by]
    top = max(max(h["rc"] + h["xrc_send"] + len(h["holders"]) for h in r["hosts"])
              for r in results)
    W, H, L, B, T = 760, 360, 60, 300, 50
    gw = (W - L - 20) / len(combos)
    bw = gw / 3
    ys = lambda v: B - (B - T) * v / top
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         f'font-family="sans-serif" font-size="12">',
         f'<text x="{W/2}" y="20" text-anchor="middle" font-size="14">QPs per host, '
         'all-to-all through verbs;ofi_rxm (Open MPI mtl ofi)</text>',
         f'<line x1="{L}" y1="{B}" x2="{W-10}" y2="{B}" stroke="black"/>',
         f'<line x1="{L}" y1="{T}" x2="{L}" y2="{B}" stroke="black"/>']
    step = max(1, round(top / 6))
    for v in range(0, top + 1, step):
        o.append(f'<text x="{L-6}" y="{ys(v)+4:.1f}" text-anchor="end">{v}</text>')
        o.append(f'<line x1="{L}" y1="{ys(v):.1f}" x2="{W-10}" y2="{ys(v):.1f}" '
                 'stroke="#ddd"/>')
    for k, (n, p) in enumerate(combos):
        x0 = L + k * gw + bw / 2
        rc = by[(n, p, "rc")]["hosts"][0]["rc"]
        x = by[(n, p, "xrc")]["hosts"][0]
        s, rq = x["xrc_send"], len(x["holders"])
        o.append(f'<rect x="{x0:.1f}" y="{ys(rc):.1f}" width="{bw:.1f}" '
                 f'height="{B-ys(rc):.1f}" fill="#c0504d"/>')
        o.append(f'<text x="{x0+bw/2:.1f}" y="{ys(rc)-4:.1f}" text-anchor="middle">{rc}</text>')
        xx = x0 + bw
        o.append(f'<rect x="{xx:.1f}" y="{ys(s):.1f}" width="{bw:.1f}" height="{B-ys(s):.1f}" '
                 'fill="#4f81bd"/>')
        o.append(f'<rect x="{xx:.1f}" y="{ys(s+rq):.1f}" width="{bw:.1f}" '
                 f'height="{ys(s)-ys(s+rq):.1f}" fill="#a7c0de"/>')
        o.append(f'<text x="{xx+bw/2:.1f}" y="{ys(s+rq)-4:.1f}" text-anchor="middle">'
                 f'{s}+{rq}</text>')
        o.append(f'<text x="{x0+bw:.1f}" y="{B+16}" text-anchor="middle">N={n} P={p}</text>')
    ly = H - 22
    for i, (c, label) in enumerate([("#c0504d", "RC QPs"), ("#4f81bd", "XRC send QPs"),
                                    ("#a7c0de", "XRC receive QPs (shared, in the XRC domain)")]):
        lx = L + i * 170
        o.append(f'<rect x="{lx}" y="{ly-10}" width="12" height="12" fill="{c}"/>')
        o.append(f'<text x="{lx+16}" y="{ly}">{label}</text>')
    o.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(o) + "\n")

def main():
    tmp = tempfile.mkdtemp(prefix="sv-xrc-savings-")
    exe = os.path.join(tmp, "mpi_check")
    sh("mpicc.openmpi", "-O1", "-o", exe, "crates/e2e/tests/mpi/mpi_check.c")
    results = []
    for n in (2, 4):
        name = f"svsave{n}"
        sh(S, "cluster", "down", "--name", name, check=False)
        sh(S, "cluster", "up", "--name", name, "--hosts", str(n))
        try:
            for p in (1, 2, 4):
                for mode in ("rc", "xrc"):
                    r = job(name, n, p, mode, exe)
                    results.append(r)
                    if not r["failed"]:
                        print(f"N={n} P={p} {mode}: {r['hosts'][0]} first {r['first_ms']:.1f} "
                              f"ms formula {'ok' if r['ok'] else 'MISMATCH'}", file=sys.stderr)
        finally:
            sh(S, "cluster", "down", "--name", name, check=False)
    load = open("/proc/loadavg").read().split()[:3]
    print(f"load average during the run: {' '.join(load)}\n")
    print("| N×P | transport | RC QPs | XRC send QPs | XRC recv QPs (holders) | XRC SRQs "
          "| formula | daemon RSS, MiB (idle → job) | 1st all-to-all, ms | 2nd, ms |")
    print("|---|---|---:|---:|---|---:|---|---|---:|---:|")
    for r in results:
        if r["failed"]:
            print(f"| {r['n']}×{r['p']} | {r['mode'].upper()} | job failed (see the log) "
                  "| | | | | | | |")
            continue
        h = r["hosts"]
        rss = (f"{span([x / 1024 for x in r['idle_kib']], '{:.1f}')} → "
               f"{span([x['rss_kib'] / 1024 for x in h], '{:.1f}')}")
        recv = f"{span([len(x['holders']) for x in h])} ({holders_text(h[0]['holders'])})"
        print(f"| {r['n']}×{r['p']} | {r['mode'].upper()} | {span([x['rc'] for x in h])} "
              f"| {span([x['xrc_send'] for x in h])} | {recv} | {span([x['srqs'] for x in h])} "
              f"| {'matches' if r['ok'] else 'MISMATCH'} | {rss} | {r['first_ms']:.1f} "
              f"| {r['again_ms']:.1f} |")
    svg([r for r in results if not r["failed"]], SVG)
    print(f"\nSVG: {SVG}")
    if any(r["failed"] for r in results):
        sys.exit("some jobs failed")
    if not all(r["ok"] for r in results):
        sys.exit("some counts do not match the formulas")

main()
PY
