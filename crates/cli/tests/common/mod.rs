//! What the capture and rejected-packet tests share: a directory of their own for the
//! daemon's capture, and an RC QP brought up towards a peer by hand.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use softverbs::{Access, AhAttr, AttrMask as M, Mtu, QpAttr, QpState};

/// A directory removed when dropped.
pub struct Dir(pub PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A directory of the test's own (0755) in the system's temporary directory, named from
/// `prefix`, the process and `name`, with a capture directory `cap` (0700) in it.
pub fn dir(prefix: &str, name: &str) -> (Dir, PathBuf) {
    let d = std::env::temp_dir().join(format!("{prefix}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cap = d.join("cap");
    std::fs::create_dir(&cap).unwrap();
    std::fs::set_permissions(&cap, std::fs::Permissions::from_mode(0o700)).unwrap();
    (Dir(d), cap)
}

/// RESET -> INIT -> RTR -> RTS of RC QP `qp` towards `remote_qpn` at `gid`, from GID index 0,
/// both PSNs 0.
pub fn connect(qp: &softverbs::Qp<'_>, gid: softverbs::Gid, remote_qpn: u32) {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: Access(0x0f),
        ..QpAttr::default()
    };
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
        .unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ah_attr: AhAttr {
            dgid: gid,
            is_global: true,
            port_num: 1,
            hop_limit: 64,
            ..AhAttr::default()
        },
        path_mtu: Mtu::M1024,
        dest_qp_num: remote_qpn,
        max_dest_rd_atomic: 1,
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
    )
    .unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout: 18,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
        ..rtr
    };
    qp.modify(
        &rts,
        M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
    )
    .unwrap();
}
