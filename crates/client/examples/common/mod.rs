//! What every example needs: a daemon to talk to and an RC connection.
#![allow(dead_code)]

use std::path::PathBuf;

use softverbs::{Access, AhAttr, AttrMask as M, Gid, Mtu, Qp, QpAttr, QpCap, QpState};

/// Where the daemon listens. A real program just calls `Context::open(0)` (which finds the
/// daemon, or starts one); the examples start their own in this process so that they run
/// anywhere, unless `SOFTVERBS_SOCKET` names one.
pub struct Daemon {
    pub socket: PathBuf,
    _daemon: Option<softverbs_daemon::TestDaemon>,
    dir: Option<PathBuf>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

pub fn daemon(name: &str) -> Daemon {
    if let Some(s) = std::env::var_os("SOFTVERBS_SOCKET") {
        return Daemon {
            socket: s.into(),
            _daemon: None,
            dir: None,
        };
    }
    let dir = std::env::temp_dir().join(format!("softverbs-example-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temporary directory");
    let config = softverbs_daemon::Config::new(dir.join("sv.sock"));
    let d = softverbs_daemon::spawn_daemon_with(config).expect("start a daemon");
    Daemon {
        socket: d.socket.clone(),
        _daemon: Some(d),
        dir: Some(dir),
    }
}

pub const ALL: Access = Access(
    Access::LOCAL_WRITE.0
        | Access::REMOTE_WRITE.0
        | Access::REMOTE_READ.0
        | Access::REMOTE_ATOMIC.0,
);

pub fn cap() -> QpCap {
    QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

/// RESET -> INIT -> RTR -> RTS towards `remote_qpn` at `remote_gid` (ibv_modify_qp(3); the
/// masks are the ones IBA 11.2.4.2 requires for each RC transition).
pub fn connect_rc(qp: &Qp<'_>, remote_gid: Gid, remote_qpn: u32) -> softverbs::Result<()> {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: ALL,
        ..QpAttr::default()
    };
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)?;
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: AhAttr {
            dgid: remote_gid,
            is_global: true,
            port_num: 1,
            hop_limit: 64,
            ..AhAttr::default()
        },
        path_mtu: Mtu::M1024,
        dest_qp_num: remote_qpn,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        ..init
    };
    qp.modify(
        &rtr,
        M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER,
    )?;
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout: 12,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 4,
        ..rtr
    };
    qp.modify(
        &rts,
        M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
    )
}
