//! Per-QP and per-port counters (`softverbs stat`, docs/guide/counters.md), named as
//! rdma-core shows a NIC's `hw_counters` where one exists (rxe's names first, then mlx5's),
//! so that a user who knows `rdma statistic` reads them without a dictionary.
//!
//! They are counted here, in the engine, and nowhere else: the daemon, the simulator and the
//! net path's library all run this engine, so every path that moves RoCE packets counts the
//! same events the same way. What the engine cannot see is what the shell drops before it
//! hands a packet over (a bad ICRC, a datagram that is no RoCE v2 packet, a forged own
//! source), which the daemon counts next to that check, by the same [`Reject`] reasons.

/// Defines [`Counters`] and its one table of names, so the struct, the JSON keys, the
/// Prometheus series and the documentation (docs/guide/counters.md) cannot drift apart.
macro_rules! counters {
    ($( $(#[$m:meta])* $name:ident, )*) => {
        /// Event counts of one QP, or of a whole port (the sum over its QPs, the destroyed
        /// ones included). Every field only grows.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct Counters {
            $( $(#[$m])* pub $name: u64, )*
        }

        impl Counters {
            /// Every counter's name, in a fixed order.
            pub const NAMES: &'static [&'static str] = &[$( stringify!($name), )*];

            /// `(name, value)` of every counter, in [`NAMES`](Self::NAMES) order.
            pub fn fields(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$( (stringify!($name), self.$name), )*].into_iter()
            }

            /// Adds every counter of `o` to this one.
            pub fn add(&mut self, o: &Counters) {
                $( self.$name = self.$name.wrapping_add(o.$name); )*
            }

            /// The counter named `name` (one of [`NAMES`](Self::NAMES)).
            pub fn get(&self, name: &str) -> Option<u64> {
                match name {
                    $( stringify!($name) => Some(self.$name), )*
                    _ => None,
                }
            }

            /// Sets the counter named `name`; `false` for an unknown name.
            pub fn set(&mut self, name: &str, v: u64) -> bool {
                match name {
                    $( stringify!($name) => { self.$name = v; true } )*
                    _ => false,
                }
            }
        }
    };
}

counters! {
    /// RoCE packets sent (BTH through ICRC), first transmissions and retransmissions
    /// (rxe `sent_pkts`).
    sent_pkts,
    /// RoCE packets taken in for a QP: parsed, addressed to it and from its peer (rxe
    /// `rcvd_pkts`).
    rcvd_pkts,
    /// Bytes of the packets in `sent_pkts`, BTH through ICRC (no IP/UDP headers).
    sent_bytes,
    /// Bytes of the packets in `rcvd_pkts`, BTH through ICRC.
    rcvd_bytes,
    /// Request packets sent again: go-back-N after an ACK timeout, a sequence NAK or an RNR
    /// NAK (mlx5 `roce_adp_retrans` counts the NIC's own retransmissions likewise).
    retransmitted_pkts,
    /// Request packets with a PSN already executed (rxe and mlx5 `duplicate_request`).
    duplicate_request,
    /// Request packets with a PSN past the expected one: a gap (rxe `out_of_seq_request`,
    /// mlx5 `out_of_sequence`).
    out_of_seq_request,
    /// Sequence-error NAKs sent by the responder (IBA 9.7.5.2.1).
    send_seq_nak,
    /// RNR NAKs received by the requester (rxe `rcvd_rnr_err`, mlx5 `rnr_nak_retry_err`).
    rcvd_rnr_err,
    /// RNR NAKs sent by the responder: a SEND found no receive (rxe `send_rnr_err`).
    send_rnr_err,
    /// Sequence-error NAKs received by the requester (rxe `rcvd_seq_err`, mlx5
    /// `packet_seq_err`).
    rcvd_seq_err,
    /// ACK timeouts that led to a retransmission (rxe `completer_retry_err`, mlx5
    /// `local_ack_timeout_err`).
    completer_retry_err,
    /// Requests failed with `IBV_WC_RETRY_EXC_ERR` (rxe `retry_exceeded_err`, mlx5
    /// `req_transport_retries_exceeded`).
    retry_exceeded_err,
    /// Requests failed with `IBV_WC_RNR_RETRY_EXC_ERR` (rxe `retry_rnr_exceeded_err`, mlx5
    /// `req_rnr_retries_exceeded`).
    retry_rnr_exceeded_err,
    /// Requests the peer refused with a remote access error NAK (mlx5
    /// `req_remote_access_errors`).
    req_remote_access_errors,
    /// Requests this responder refused with a remote access error NAK (mlx5
    /// `resp_remote_access_errors`).
    resp_remote_access_errors,
    /// Request messages whose last packet was sent for the first time (rxe `rdma_sends`).
    rdma_sends,
    /// Request messages whose last packet was received and executed (rxe `rdma_recvs`).
    rdma_recvs,
    /// RDMA WRITE request packets received and executed (mlx5 `rx_write_requests`).
    rx_write_requests,
    /// RDMA READ requests received and executed, duplicates included (mlx5
    /// `rx_read_requests`).
    rx_read_requests,
    /// Atomic requests received and executed (mlx5 `rx_atomic_requests`).
    rx_atomic_requests,
    /// Work requests completed with `IBV_WC_LOC_PROT_ERR`: a local key or its access did not
    /// allow what the request (gathering a send, scattering a READ response or a receive)
    /// needed (IBA 10.8.3; no rxe or mlx5 equivalent).
    local_prot_err,
    /// Work requests completed with `IBV_WC_LOC_LEN_ERR`: a message longer than the receive
    /// posted for it, or a READ response past its request's buffers (mlx5
    /// `resp_local_length_error` counts the responder's side only).
    local_length_err,
}

impl Counters {
    /// Counts an error completion that the local side caused (`local_prot_err`,
    /// `local_length_err`); other statuses are counted where their cause is seen.
    pub(crate) fn local_error(&mut self, status: crate::wr::WcStatus) {
        match status {
            crate::wr::WcStatus::LocProtErr => self.local_prot_err += 1,
            crate::wr::WcStatus::LocLenErr => self.local_length_err += 1,
            _ => {}
        }
    }
}

/// Defines [`Reject`] and [`Rejects`] from one table: each reason, its counter's name and
/// the words a capture's packet comment gives it (docs/guide/counters.md, "Rejected
/// packets"; docs/guide/capture.md).
macro_rules! rejects {
    ($( $(#[$m:meta])* $variant:ident => $name:literal, $words:literal; )*) => {
        /// Why a received packet was dropped: one reason per drop, the first check it failed,
        /// in the order of IBA 9.6 ("Packet Transport Header Validation": the checks a
        /// receiver makes before a packet reaches a QP's responder or completer).
        ///
        /// The daemon's device sockets (ICRC, malformed datagrams, a forged own source), the
        /// engine (everything from the BTH on) and a net-path library's engine count the same
        /// reasons, so a drop is named alike wherever it happened.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Reject {
            $( $(#[$m])* $variant, )*
        }

        impl Reject {
            /// Every reason, in counter order.
            pub const ALL: &'static [Reject] = &[$( Reject::$variant, )*];

            /// The port counter this reason bumps (`rx_drop_...`).
            pub fn name(self) -> &'static str {
                match self { $( Reject::$variant => $name, )* }
            }

            /// The reason in words, as a capture's comment says it ("bad ICRC").
            pub fn words(self) -> &'static str {
                match self { $( Reject::$variant => $words, )* }
            }
        }
    };
}

rejects! {
    /// The ICRC did not check out (IBA 7.8.1, as RoCE v2's Annex A17 adapts it): counted by the shell
    /// that checks it, before any header is read.
    BadIcrc => "rx_drop_bad_icrc", "bad ICRC";
    /// Too short for its headers, a BTH version other than 0, a reserved opcode, a pad count
    /// the payload does not hold, or an IP/UDP envelope that cannot be a RoCE v2 datagram
    /// (IBA 9.6: the BTH's checks).
    Malformed => "rx_drop_malformed", "malformed (truncated, bad version or opcode)";
    /// The destination address is not this port's for the QP: a connected QP's packet to
    /// another GID of the port than its own, a multicast group no QP of the device is
    /// attached to (IBA 9.6; RoCE v2 carries the GIDs in the IP header).
    WrongDest => "rx_drop_wrong_dest", "wrong destination address";
    /// No QP with the BTH's destination QPN (IBA 9.6).
    UnknownQp => "rx_drop_unknown_qp", "unknown QP";
    /// From an address other than the connected QP's peer (IBA 9.6 for connected service types).
    ForeignSource => "rx_drop_foreign_source", "source is not the QP's peer";
    /// From the network with one of this daemon's own addresses as source: forged
    /// (docs/design/security.md, "CM").
    OwnSource => "rx_drop_own_source", "source is this daemon's own address";
    /// The BTH's P_Key does not match the port's (IBA 9.6, 10.9: the port's only P_Key is the default 0xFFFF).
    BadPkey => "rx_drop_bad_pkey", "bad P_Key";
    /// A datagram whose Q_Key is not the UD QP's (IBA 9.6, 10.2.5).
    BadQkey => "rx_drop_bad_qkey", "bad Q_Key";
    /// An opcode the QP's type does not take: another transport's (an RC packet for a UD
    /// QP), a request for an XRC send QP, a UD opcode other than SEND (IBA 9.6).
    BadOpcode => "rx_drop_bad_opcode", "opcode invalid for the QP type";
    /// The QP is in no state that receives: RESET or INIT (no path yet), or a response for
    /// a QP that is not RTS or SQD (IBA 9.6, 10.3.1).
    QpState => "rx_drop_qp_state", "QP not in a receive state";
    /// A response whose PSN is outside the window of outstanding requests: a duplicate or a
    /// ghost (IBA 9.7.5.1; `net_outside_window` of `softverbs status`).
    PsnWindow => "rx_drop_psn_window", "response PSN outside the window";
    /// A UD datagram with no receive posted (IBA 9.8.1; mlx5 counts it as `out_of_buffer`).
    NoRecv => "rx_drop_no_recv", "no receive posted (UD)";
}

/// Received packets dropped, by [`Reject`] reason: a port's, only growing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rejects([u64; Reject::ALL.len()]);

impl Rejects {
    /// Counts one packet dropped for `r`.
    pub fn count(&mut self, r: Reject) {
        self.0[r as usize] = self.0[r as usize].wrapping_add(1);
    }

    /// Counts `n` packets dropped for `r` (what another counter of the same drops holds).
    pub fn count_n(&mut self, r: Reject, n: u64) {
        self.0[r as usize] = self.0[r as usize].wrapping_add(n);
    }

    /// The packets dropped for `r`.
    pub fn get(&self, r: Reject) -> u64 {
        self.0[r as usize]
    }

    /// Adds every count of `o`.
    pub fn add(&mut self, o: &Rejects) {
        for (a, b) in self.0.iter_mut().zip(o.0) {
            *a = a.wrapping_add(b);
        }
    }

    /// `(counter name, value)` of every reason, in [`Reject::ALL`] order.
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Reject::ALL.iter().map(|&r| (r.name(), self.get(r)))
    }

    /// Every packet dropped, whatever the reason.
    pub fn total(&self) -> u64 {
        self.0.iter().fold(0u64, |a, &b| a.wrapping_add(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_own_counter_name() {
        let mut names: Vec<&str> = Reject::ALL.iter().map(|r| r.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Reject::ALL.len());
        assert!(names.iter().all(|n| n.starts_with("rx_drop_")));
        let mut r = Rejects::default();
        r.count(Reject::UnknownQp);
        r.count(Reject::UnknownQp);
        assert_eq!(r.get(Reject::UnknownQp), 2);
        assert_eq!(r.total(), 2);
    }
}
