//! Helpers shared by the owning-API tests: a daemon in a temporary directory and an RC
//! connection.
#![allow(dead_code)]

use softverbs::{Access, AhAttr, AttrMask as M, Gid, Mtu, QpAttr, QpCap, QpState};
use softverbs_daemon::{spawn_daemon_with, Config, DeviceSpec, TestDaemon};

pub struct Dir(std::path::PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn daemon(name: &str, ip: Option<&str>) -> (TestDaemon, Dir) {
    daemon_with(name, ip, None)
}

/// [`daemon`], its device injecting `faults` into what it sends.
pub fn daemon_with(
    name: &str,
    ip: Option<&str>,
    faults: Option<softverbs_transport::Faults>,
) -> (TestDaemon, Dir) {
    let dir = std::env::temp_dir().join(format!("svown-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = Config::new(dir.join("sv.sock"));
    if let Some(ip) = ip {
        c.devices = vec![DeviceSpec {
            name: format!("sv-{name}"),
            ips: vec![ip.parse().unwrap()],
        }];
        c.net.bind = true;
        c.net.faults = faults;
    }
    (spawn_daemon_with(c).unwrap(), Dir(dir))
}

pub const ALL: softverbs::Access = softverbs::Access(0x0f);

pub fn cap() -> QpCap {
    QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_inline_data: 64,
    }
}

/// How a test connects an RC (or UC) QP: local ACK timeout exponent (4.096 µs · 2^timeout),
/// READ and atomic depth each way, the starting PSN of both directions, the QP's access flags
/// and its retry counts (ibv_modify_qp(3); a UC QP takes only what UC has).
#[derive(Clone, Copy)]
pub struct RcPath {
    pub timeout: u8,
    pub rd_atomic: u8,
    pub psn: u32,
    pub access: Access,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
}

impl Default for RcPath {
    fn default() -> RcPath {
        RcPath {
            timeout: 12,
            rd_atomic: 4,
            psn: 0,
            access: ALL,
            retry_cnt: 7,
            rnr_retry: 7,
        }
    }
}

/// RESET->INIT->RTR->RTS towards `remote` with the default [`RcPath`].
pub fn connect(qp: &softverbs::Qp<'_>, remote_gid: Gid, remote_qpn: u32) {
    connect_with(qp, remote_gid, remote_qpn, RcPath::default());
}

/// RESET->INIT->RTR->RTS towards `remote` along `path`.
pub fn connect_with(qp: &softverbs::Qp<'_>, remote_gid: Gid, remote_qpn: u32, path: RcPath) {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: path.access,
        ..QpAttr::default()
    };
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
        .unwrap();
    let rc = qp.qp_type() == softverbs::QpType::Rc;
    let av = AhAttr {
        dgid: remote_gid,
        is_global: true,
        port_num: 1,
        hop_limit: 64,
        ..AhAttr::default()
    };
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: av,
        path_mtu: Mtu::M1024,
        dest_qp_num: remote_qpn,
        max_dest_rd_atomic: path.rd_atomic,
        rq_psn: path.psn,
        min_rnr_timer: 1,
        ..init
    };
    let mut rtr_mask = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    if rc {
        rtr_mask = rtr_mask | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
    }
    qp.modify(&rtr, rtr_mask).unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout: path.timeout,
        sq_psn: path.psn,
        retry_cnt: path.retry_cnt,
        rnr_retry: path.rnr_retry,
        max_rd_atomic: path.rd_atomic,
        ..rtr
    };
    let mut rts_mask = M::STATE | M::SQ_PSN;
    if rc {
        rts_mask = rts_mask | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
    }
    qp.modify(&rts, rts_mask).unwrap();
}

/// A child process that is killed and reaped however the test ends.
pub struct Reaped(pub std::process::Child);
impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits (up to `within`) until the daemon at `socket` holds no context, QP, CQ, PD or MR
/// of process `pid` (`softverbs resources`); panics with what is left otherwise.
pub fn wait_until_nothing_of(socket: &std::path::Path, pid: u32, within: std::time::Duration) {
    let info = softverbs::Introspect::connect_at(socket).unwrap();
    let deadline = std::time::Instant::now() + within;
    loop {
        let r = info.resources().unwrap();
        let theirs = ["contexts", "qps", "cqs", "pds", "mrs"]
            .iter()
            .flat_map(|k| r[*k].as_array().cloned().unwrap_or_default())
            .filter(|row| row["pid"].as_u64() == Some(u64::from(pid)))
            .count();
        if theirs == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "left of process {pid}: {r:#}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
