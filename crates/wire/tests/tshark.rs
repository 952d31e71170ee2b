//! Cross-checks the crate's framing, ICRC and XRC layout against Wireshark: writes a pcap
//! with one packet of every valid opcode (RC, UC, UD, XRC; IPv4 and IPv6) plus deliberately
//! corrupted ones, and has `tshark` with `tools/wireshark/softverbs.lua` read it back.
//!
//! Needs `tshark` (Debian package `tshark`). Without it the test is skipped with a message,
//! unless the `CI` environment variable is set, in which case it fails. Set
//! `SOFTVERBS_KEEP_PCAP=1` to keep the capture (under the target's `tmp/` directory) after a
//! passing run; a failing run always keeps it.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use softverbs_testkit::{frame_numbers, tshark, tshark_available};
use softverbs_wire::ip::{self, IpRepr, Ipv4Repr, Ipv6Repr, UdpRepr, ROCE_V2_UDP_PORT};
use softverbs_wire::pcap::{self, PcapReader, PcapWriter};
use softverbs_wire::{
    parse_roce_v2, AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, HeaderKind,
    Headers, IethRepr, ImmDtRepr, NakCode, Opcode, Position, RethRepr, Syndrome, WireError,
    XrcethRepr,
};

/// One frame of the capture and what tshark must say about it.
struct Expect {
    opcode: Opcode,
    icrc_good: bool,
    srqn: Option<u32>,
}

/// A payload of `len` recognisable bytes.
fn payload(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_mul(31).wrapping_add(i as u8))
        .collect()
}

/// Plausible headers for `opcode`: BTH with the AckReq a requester would set, and every
/// extension header the opcode carries.
fn headers_for(opcode: Opcode, i: u32) -> (Headers, usize) {
    let info = opcode.info().unwrap();
    let mut bth = BthRepr::new(opcode, 0x000100 + i, 0x00F000 + i);
    bth.ack_req = matches!(info.position, Position::Last | Position::Only)
        && matches!(info.direction, softverbs_wire::Direction::Request);
    bth.solicited = info.immediate;
    let mut h = Headers::new(bth);
    let on = |k| info.headers.contains(k);
    let srqn = 0x00_0100 | ((i * 0x01_0101) & 0x00FF_FFFF);
    h.xrceth = on(HeaderKind::Xrceth).then_some(XrcethRepr { xrc_srq: srqn });
    h.deth = on(HeaderKind::Deth).then_some(DethRepr {
        qkey: 0x1111_0000 + i,
        src_qp: 0x42,
    });
    h.reth = on(HeaderKind::Reth).then_some(RethRepr {
        va: 0x7F00_DEAD_0000 + u64::from(i) * 0x1000,
        rkey: 0x0000_1234 + i,
        dma_len: 4096,
    });
    h.atomic_eth = on(HeaderKind::AtomicEth).then_some(AtomicEthRepr {
        va: 0x7F00_BEEF_0008,
        rkey: 0x5678,
        swap_add: 7,
        compare: 3,
    });
    let syndrome = match opcode.0 & 0x1F {
        // Vary the ACK syndromes; READ responses carry a plain ACK.
        0x11 if opcode.0 < 0x20 => Syndrome::RnrNak { timer: 14 },
        0x11 => Syndrome::Nak {
            code: NakCode::PsnSeqErr,
        },
        _ => Syndrome::Ack { credits: 0x1F },
    };
    h.aeth = on(HeaderKind::Aeth).then_some(AethRepr { syndrome, msn: i });
    h.atomic_ack_eth = on(HeaderKind::AtomicAckEth).then_some(AtomicAckEthRepr { orig: 3 });
    h.imm_dt = on(HeaderKind::ImmDt).then_some(ImmDtRepr {
        imm: 0xC0FF_EE00 + i,
    });
    h.ieth = on(HeaderKind::Ieth).then_some(IethRepr { rkey: 0x9999 });
    // Payload lengths 1..=67 cover every PadCnt; MIDDLE packets are "full" 256-byte MTU.
    let len = match (info.payload, info.position) {
        (false, _) => 0,
        (true, Position::Middle) => 256,
        (true, _) => 1 + (i as usize * 7) % 67,
    };
    (h, len)
}

fn ipv4(last: u8) -> IpRepr {
    IpRepr::V4(Ipv4Repr {
        tos: 0x02, // ECT(0), as RoCE v2 NICs send
        identification: u16::from(last),
        ..Ipv4Repr::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, last))
    })
}

fn ipv6(last: u16) -> IpRepr {
    IpRepr::V6(Ipv6Repr {
        traffic_class: 0x6A,
        flow_label: 0x12345,
        ..Ipv6Repr::new(
            Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1),
            Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, last),
        )
    })
}

/// Offset of the last payload byte in a frame (the byte before pad and ICRC).
fn last_payload_byte(frame: &[u8]) -> usize {
    let datagram = pcap::ethernet_payload(frame).unwrap();
    let d = parse_roce_v2(datagram).unwrap();
    assert!(!d.packet.payload.is_empty());
    frame.len() - 4 - d.packet.pad().len() - 1
}

/// Builds the capture; returns its frames' expectations in frame order.
fn build_capture(path: &Path) -> Vec<Expect> {
    let file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut w = PcapWriter::new(file).unwrap();
    let mut expects = Vec::new();
    let t0 = Duration::from_secs(1_764_000_000);
    let mut push = |w: &mut PcapWriter<_>, frame: &[u8], e: Expect| {
        let ts = t0 + Duration::from_micros(10 * expects.len() as u64);
        w.write_frame(ts, frame).unwrap();
        expects.push(e);
    };

    let mut corrupt_later = Vec::new();
    for (i, opcode) in Opcode::all_valid().enumerate() {
        let i = i as u32;
        let (headers, len) = headers_for(opcode, i);
        let body = payload(i as u8, len);
        // Every third packet over IPv6.
        let ip = if i % 3 == 2 {
            ipv6(2 + i as u16)
        } else {
            ipv4(2 + i as u8)
        };
        let udp = UdpRepr {
            src_port: 0xC000 | (0x100 + i as u16),
            dst_port: ROCE_V2_UDP_PORT,
        };
        let frame = pcap::roce_v2_frame_from_headers(&ip, &udp, &headers, &body).unwrap();
        // The datagram the crate built must parse and verify with the crate, too.
        parse_roce_v2(pcap::ethernet_payload(&frame).unwrap()).unwrap();
        let srqn = headers.xrceth.map(|x| x.xrc_srq);
        push(
            &mut w,
            &frame,
            Expect {
                opcode,
                icrc_good: true,
                srqn,
            },
        );
        if matches!(opcode.0, 0x04 | 0x24 | 0x64 | 0xA4 | 0xAB | 0xB0) {
            corrupt_later.push((frame, opcode, srqn));
        }
    }

    // Variant fields rewritten in flight (ECN CE, TTL decrement, FECN/BECN) keep the ICRC:
    // copies of the six SEND_ONLY / WRITE_ONLY_IMM / READ_RESPONSE_ONLY frames, changed after
    // the ICRC was computed, must still verify.
    for (frame, opcode, srqn) in &corrupt_later {
        let mut f = frame.clone();
        let bth = match f[12..14] {
            [0x08, 0x00] => {
                f[14 + 1] |= 0x03; // ECN CE
                f[14 + 8] -= 1; // TTL
                f[14 + 10..14 + 12].fill(0);
                let csum = ip::ipv4_header_checksum(&f[14..14 + 20]);
                f[14 + 10..14 + 12].copy_from_slice(&csum.to_be_bytes());
                14 + 20 + 8
            }
            _ => {
                f[14 + 1] = 0xFF; // traffic class low nibble + flow label
                f[14 + 7] -= 1; // hop limit
                14 + 40 + 8
            }
        };
        f[bth + 4] |= 0xC0; // FECN | BECN
        push(
            &mut w,
            &f,
            Expect {
                opcode: *opcode,
                icrc_good: true,
                srqn: *srqn,
            },
        );
    }

    // An empty SEND_ONLY is a 58-byte frame, which a NIC pads to the 60-byte Ethernet
    // minimum: the padding is outside the UDP length and must not enter the ICRC.
    let empty = pcap::roce_v2_frame_from_headers(
        &ipv4(200),
        &UdpRepr {
            src_port: 0xC0C8,
            dst_port: ROCE_V2_UDP_PORT,
        },
        &Headers::new(BthRepr::new(Opcode(0x04), 0xC8, 0x10)),
        &[],
    )
    .unwrap();
    assert_eq!(empty.len(), 58);
    let mut padded = empty.clone();
    padded.resize(60, 0);
    push(
        &mut w,
        &padded,
        Expect {
            opcode: Opcode(0x04),
            icrc_good: true,
            srqn: None,
        },
    );
    // An 802.1Q-tagged XRC request (VLAN 5, priority 3) moves every header by 4 bytes.
    let (frame, opcode, srqn) = &corrupt_later[3];
    assert_eq!(opcode.0, 0xA4);
    let mut tagged = frame[..12].to_vec();
    tagged.extend_from_slice(&[0x81, 0x00, 0x60, 0x05]);
    tagged.extend_from_slice(&frame[12..]);
    push(
        &mut w,
        &tagged,
        Expect {
            opcode: *opcode,
            icrc_good: true,
            srqn: *srqn,
        },
    );

    // Corrupted: one payload byte flipped after the ICRC was computed.
    for (frame, opcode, srqn) in &corrupt_later {
        let mut f = frame.clone();
        let at = last_payload_byte(&f);
        f[at] ^= 0x01;
        let datagram = pcap::ethernet_payload(&f).unwrap();
        assert!(matches!(
            parse_roce_v2(datagram),
            Err(WireError::IcrcMismatch { .. })
        ));
        push(
            &mut w,
            &f,
            Expect {
                opcode: *opcode,
                icrc_good: false,
                srqn: *srqn,
            },
        );
    }
    // And one with the ICRC itself damaged, and one with an invariant header bit (P_Key).
    let (frame, opcode, srqn) = &corrupt_later[0];
    let mut f = frame.clone();
    let n = f.len();
    f[n - 1] ^= 0x80;
    push(
        &mut w,
        &f,
        Expect {
            opcode: *opcode,
            icrc_good: false,
            srqn: *srqn,
        },
    );
    let mut f = frame.clone();
    f[14 + 20 + 8 + 3] ^= 0x01; // P_Key low byte (frame is IPv4)
    push(
        &mut w,
        &f,
        Expect {
            opcode: *opcode,
            icrc_good: false,
            srqn: *srqn,
        },
    );

    w.into_inner().into_inner().unwrap();
    expects
}

fn parse_hex(s: &str) -> u32 {
    u32::from_str_radix(s.trim_start_matches("0x"), 16).unwrap()
}

#[test]
fn tshark_agrees_on_every_opcode_icrc_and_xrceth() {
    let Some(version) = tshark_available() else {
        return;
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("softverbs-wire-tshark-{}", std::process::id()));
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let cap = dir.join("all-opcodes.pcap");
    let expects = build_capture(&cap);

    // The file reads back with the crate's own reader, too.
    let records: Vec<_> = PcapReader::new(std::fs::File::open(&cap).unwrap())
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(records.len(), expects.len());

    let fields = tshark(
        &cap,
        &home,
        &[
            "-T",
            "fields",
            "-E",
            "separator=/t",
            "-e",
            "frame.number",
            "-e",
            "_ws.malformed",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "softverbs.icrc.status",
            "-e",
            "softverbs.xrceth.srqn",
            "-e",
            "_ws.lua.error",
        ],
    );
    eprintln!("{version}\n{fields}");
    let rows: BTreeMap<usize, Vec<&str>> = fields
        .lines()
        .map(|l| {
            let cols: Vec<&str> = l.split('\t').collect();
            (cols[0].parse().unwrap(), cols)
        })
        .collect();
    assert_eq!(rows.len(), expects.len(), "one line per frame");
    for (n, e) in expects.iter().enumerate() {
        let cols = &rows[&(n + 1)];
        let ctx = format!("frame {} ({}): {cols:?}", n + 1, e.opcode);
        assert_eq!(cols.len(), 6, "{ctx}");
        assert_eq!(cols[1], "", "malformed: {ctx}");
        assert_eq!(cols[2], e.opcode.0.to_string(), "Wireshark's opcode: {ctx}");
        let status = if e.icrc_good { "good" } else { "bad" };
        assert_eq!(cols[3], status, "ICRC status: {ctx}");
        match e.srqn {
            Some(srqn) => assert_eq!(parse_hex(cols[4]), srqn, "SRQN: {ctx}"),
            None => assert_eq!(cols[4], "", "no XRCETH expected: {ctx}"),
        }
        assert_eq!(cols[5], "", "Lua error: {ctx}");
    }

    // The same facts through display filters, as a user would ask.
    let frames_where = |filter: &str| {
        frame_numbers(&tshark(
            &cap,
            &home,
            &["-Y", filter, "-T", "fields", "-e", "frame.number"],
        ))
    };
    let bad: Vec<usize> = (1..=expects.len())
        .filter(|&n| !expects[n - 1].icrc_good)
        .collect();
    assert_eq!(
        frames_where("_ws.malformed || _ws.lua.error"),
        Vec::<usize>::new()
    );
    assert_eq!(frames_where("softverbs.icrc.status == \"bad\""), bad);
    assert_eq!(frames_where("softverbs.icrc.bad"), bad);
    assert_eq!(
        frames_where("softverbs.icrc.status == \"good\"").len(),
        expects.len() - bad.len()
    );
    // Every expert error in the capture is one of ours.
    assert_eq!(frames_where("_ws.expert.severity == error"), bad);
    let xrc_requests: Vec<usize> = (1..=expects.len())
        .filter(|&n| expects[n - 1].srqn.is_some())
        .collect();
    assert_eq!(frames_where("softverbs.xrceth.srqn"), xrc_requests);
    assert!(xrc_requests.len() >= 17);

    if std::env::var_os("SOFTVERBS_KEEP_PCAP").is_none() {
        std::fs::remove_dir_all(&dir).ok();
    }
}
