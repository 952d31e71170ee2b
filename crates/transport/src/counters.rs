//! Per-QP and per-port counters (`softverbs stat`, docs/guide/counters.md), named as
//! rdma-core shows a NIC's `hw_counters` where one exists (rxe's names first, then mlx5's),
//! so that a user who knows `rdma statistic` reads them without a dictionary.
//!
//! They are counted here, in the engine, and nowhere else: the daemon, the simulator and the
//! net path's library all run this engine, so every path that moves RoCE packets counts the
//! same events the same way. The only port counter the engine cannot see is the ICRC check
//! (the shell verifies the ICRC before it hands a packet over), which the daemon counts next
//! to that check.

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
