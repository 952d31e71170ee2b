//! Framing and the extension rules: how a request is split into header and struct, how a
//! struct of another ABI size is read, and how responses are cut to what the client holds.

use core::mem::size_of;
use zerocopy::little_endian::{I32, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::errno;
use crate::msg::{request_layout, Cmd, CmdHeader, Command, RespHeader};
use crate::MAX_MSG;

/// Why a message could not be decoded. Each carries the errno the daemon answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Shorter than a header, or `req_len`/`len` disagrees with the datagram (`EINVAL`).
    Malformed,
    /// The command id is unknown (`EOPNOTSUPP`).
    UnknownCommand(u32),
    /// `comp_mask` bits this ABI level does not know (`EOPNOTSUPP`).
    UnknownCompMask(u64),
    /// Bytes past what this ABI level understands are not zero (`EOPNOTSUPP`).
    NonZeroTail,
    /// The response answers another command than the one asked (`EINVAL`).
    WrongCommand,
}

impl DecodeError {
    /// The errno the peer is told.
    pub fn errno(self) -> i32 {
        match self {
            DecodeError::Malformed | DecodeError::WrongCommand => errno::EINVAL,
            DecodeError::UnknownCommand(_)
            | DecodeError::UnknownCompMask(_)
            | DecodeError::NonZeroTail => errno::EOPNOTSUPP,
        }
    }
}

/// A request split into its header fields and struct bytes.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The command.
    pub cmd: Cmd,
    /// The request's `comp_mask`.
    pub comp_mask: u64,
    /// How many response bytes the client can take.
    pub resp_len: usize,
    /// The struct bytes as sent.
    pub body: &'a [u8],
}

impl Request<'_> {
    /// Reads the request struct the way a daemon speaking ABI `abi` does: unknown `comp_mask`
    /// bits and non-zero bytes beyond its struct size are refused; a shorter struct reads as
    /// zeros in the missing fields.
    pub fn body<T: FromBytes + IntoBytes + Default>(&self, abi: u32) -> Result<T, DecodeError> {
        let (known_len, known_mask) = request_layout(self.cmd, abi);
        let known_len = known_len.min(size_of::<T>());
        if self.comp_mask & !known_mask != 0 {
            return Err(DecodeError::UnknownCompMask(self.comp_mask & !known_mask));
        }
        if self.body.len() > known_len && self.body[known_len..].iter().any(|&b| b != 0) {
            return Err(DecodeError::NonZeroTail);
        }
        let mut out = T::default();
        let n = self.body.len().min(known_len);
        out.as_mut_bytes()[..n].copy_from_slice(&self.body[..n]);
        Ok(out)
    }

    /// Reads the request struct of command `C` under [`Request::body`]'s rules.
    pub fn read<C: Command>(&self, abi: u32) -> Result<C::Req, DecodeError> {
        if self.cmd != C::CMD {
            return Err(DecodeError::WrongCommand);
        }
        self.body(abi)
    }
}

/// Builds the request datagram of command `C`, asking for a whole [`Command::Resp`].
pub fn encode_command<C: Command>(comp_mask: u64, req: &C::Req) -> Vec<u8> {
    encode_request(C::CMD, comp_mask, req.as_bytes(), size_of::<C::Resp>())
}

/// Reads the response to command `C` (see [`decode_response`]).
pub fn decode_reply<C: Command>(msg: &[u8]) -> Result<Result<C::Resp, i32>, DecodeError> {
    decode_response(msg, C::CMD)
}

/// Splits a request datagram.
pub fn decode_request(msg: &[u8]) -> Result<Request<'_>, DecodeError> {
    let (hdr, body) = CmdHeader::read_from_prefix(msg).map_err(|_| DecodeError::Malformed)?;
    let cmd = Cmd::from_u32(hdr.cmd.get()).ok_or(DecodeError::UnknownCommand(hdr.cmd.get()))?;
    if usize::from(hdr.req_len.get()) != body.len() {
        return Err(DecodeError::Malformed);
    }
    Ok(Request {
        cmd,
        comp_mask: hdr.comp_mask.get(),
        resp_len: usize::from(hdr.resp_len.get()),
        body,
    })
}

/// The command id a datagram claims, if it is long enough to have one (to echo in an error
/// reply).
pub fn peek_cmd(msg: &[u8]) -> u32 {
    CmdHeader::read_from_prefix(msg).map_or(0, |(h, _)| h.cmd.get())
}

/// Builds a request datagram. `body` may be a prefix of the struct (an older client).
pub fn encode_request(cmd: Cmd, comp_mask: u64, body: &[u8], resp_len: usize) -> Vec<u8> {
    let hdr = CmdHeader {
        cmd: U32::new(cmd as u32),
        req_len: U16::new(body.len() as u16),
        resp_len: U16::new(resp_len.min(MAX_MSG) as u16),
        comp_mask: U64::new(comp_mask),
    };
    let mut out = Vec::with_capacity(size_of::<CmdHeader>() + body.len());
    out.extend_from_slice(hdr.as_bytes());
    out.extend_from_slice(body);
    out
}

/// Builds a response datagram: `status` 0 with `body` cut to `max_len` bytes, or an errno
/// with no body.
pub fn encode_response(cmd: u32, status: i32, body: &[u8], max_len: usize) -> Vec<u8> {
    let body = if status == 0 {
        &body[..body.len().min(max_len)]
    } else {
        &[][..]
    };
    let hdr = RespHeader {
        cmd: U32::new(cmd),
        status: I32::new(status),
        len: U16::new(body.len() as u16),
        reserved: U16::new(0),
        reserved2: U32::new(0),
    };
    let mut out = Vec::with_capacity(size_of::<RespHeader>() + body.len());
    out.extend_from_slice(hdr.as_bytes());
    out.extend_from_slice(body);
    out
}

/// Reads a response to `cmd`: `Ok(Ok(T))` on success (fields an older daemon did not send
/// read as zero), `Ok(Err(errno))` when the daemon refused.
pub fn decode_response<T: FromBytes + IntoBytes + Immutable + KnownLayout + Default>(
    msg: &[u8],
    cmd: Cmd,
) -> Result<Result<T, i32>, DecodeError> {
    let (hdr, body) = RespHeader::read_from_prefix(msg).map_err(|_| DecodeError::Malformed)?;
    if usize::from(hdr.len.get()) != body.len() {
        return Err(DecodeError::Malformed);
    }
    if hdr.cmd.get() != cmd as u32 {
        return Err(DecodeError::WrongCommand);
    }
    if hdr.status.get() != 0 {
        return Ok(Err(hdr.status.get()));
    }
    let mut out = T::default();
    let n = body.len().min(size_of::<T>());
    out.as_mut_bytes()[..n].copy_from_slice(&body[..n]);
    Ok(Ok(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::*;

    fn create_qp_v2() -> CreateQpReq {
        CreateQpReq {
            qp_type: U32::new(10),
            present: U32::new(PRESENT_XRCD),
            xrcd: U32::new(7),
            create_flags: U32::new(2),
            ..Default::default()
        }
    }

    #[test]
    fn newer_daemon_reads_an_older_clients_shorter_struct_with_zeros() {
        let full = create_qp_v2();
        let (v1_len, _) = request_layout(Cmd::CreateQp, 1);
        let msg = encode_request(Cmd::CreateQp, 0, &full.as_bytes()[..v1_len], 64);
        let req = decode_request(&msg).unwrap();
        let got: CreateQpReq = req.body(ABI).unwrap();
        assert_eq!(got.xrcd.get(), 7);
        assert_eq!(got.create_flags.get(), 0, "missing fields read as zero");
    }
    const ABI: u32 = crate::ABI_VERSION;

    #[test]
    fn a_listen_backlog_is_read_from_abi_20_and_refused_by_older_daemons() {
        use crate::cm::CmListenReq;
        use zerocopy::little_endian::{U32, U64};
        let r = CmListenReq {
            service_id: U64::new(0x0106_1C06),
            backlog: U32::new(7),
            reserved: U32::new(0),
        };
        let msg = encode_request(Cmd::CmListen, 0, r.as_bytes(), 64);
        let req = decode_request(&msg).unwrap();
        assert_eq!(req.body::<CmListenReq>(20).unwrap().backlog.get(), 7);
        assert_eq!(req.body::<CmListenReq>(19), Err(DecodeError::NonZeroTail));
        // An older client's request (the service ID alone) reads as backlog 0.
        let msg = encode_request(Cmd::CmListen, 0, &r.as_bytes()[..8], 64);
        let got: CmListenReq = decode_request(&msg).unwrap().body(20).unwrap();
        assert_eq!((got.service_id.get(), got.backlog.get()), (0x0106_1C06, 0));
    }

    #[test]
    fn older_daemon_refuses_a_newer_field_announced_in_comp_mask() {
        let full = create_qp_v2();
        let msg = encode_request(Cmd::CreateQp, CREATE_QP_CREATE_FLAGS, full.as_bytes(), 64);
        let req = decode_request(&msg).unwrap();
        assert_eq!(
            req.body::<CreateQpReq>(1),
            Err(DecodeError::UnknownCompMask(CREATE_QP_CREATE_FLAGS))
        );
        assert_eq!(DecodeError::UnknownCompMask(1).errno(), errno::EOPNOTSUPP);
        // Without the bit, non-zero bytes the old daemon does not know are refused too.
        let msg = encode_request(Cmd::CreateQp, 0, full.as_bytes(), 64);
        assert_eq!(
            decode_request(&msg).unwrap().body::<CreateQpReq>(1),
            Err(DecodeError::NonZeroTail)
        );
        // A newer client that leaves the new fields zero works with the old daemon.
        let plain = CreateQpReq {
            create_flags: U32::new(0),
            ..full
        };
        let msg = encode_request(Cmd::CreateQp, 0, plain.as_bytes(), 64);
        assert_eq!(
            decode_request(&msg)
                .unwrap()
                .body::<CreateQpReq>(1)
                .unwrap()
                .xrcd
                .get(),
            7
        );
        // The current daemon understands all of it.
        let msg = encode_request(Cmd::CreateQp, CREATE_QP_CREATE_FLAGS, full.as_bytes(), 64);
        assert_eq!(
            decode_request(&msg)
                .unwrap()
                .body::<CreateQpReq>(ABI)
                .unwrap()
                .create_flags
                .get(),
            2
        );
    }

    #[test]
    fn framing_errors_are_typed() {
        assert_eq!(
            decode_request(&[1, 2, 3]).unwrap_err(),
            DecodeError::Malformed
        );
        let mut msg = encode_request(Cmd::AllocPd, 0, &[], 8);
        msg.push(0);
        assert_eq!(
            decode_request(&msg).unwrap_err(),
            DecodeError::Malformed,
            "req_len disagrees"
        );
        let msg = encode_request(Cmd::AllocPd, 0, &[], 8);
        let mut bad = msg.clone();
        bad[0] = 0xee;
        assert_eq!(
            decode_request(&bad).unwrap_err(),
            DecodeError::UnknownCommand(0xee)
        );
    }

    #[test]
    fn responses_are_cut_to_the_client_and_zero_filled_by_it() {
        let r = SrqResp {
            handle: U32::new(1),
            max_wr: U32::new(2),
            srqn: U32::new(9),
            ..Default::default()
        };
        let msg = encode_response(Cmd::CreateSrq as u32, 0, r.as_bytes(), 8);
        let got: SrqResp = decode_response(&msg, Cmd::CreateSrq).unwrap().unwrap();
        assert_eq!(
            (got.handle.get(), got.max_wr.get(), got.srqn.get()),
            (1, 2, 0)
        );
        let err = encode_response(Cmd::CreateSrq as u32, errno::EINVAL, r.as_bytes(), 64);
        assert_eq!(
            decode_response::<SrqResp>(&err, Cmd::CreateSrq).unwrap(),
            Err(errno::EINVAL)
        );
        assert_eq!(
            decode_response::<SrqResp>(&err, Cmd::QuerySrq).unwrap_err(),
            DecodeError::WrongCommand
        );
    }

    #[test]
    fn the_command_table_gives_ids_sizes_and_abi_levels() {
        for &c in Cmd::ALL {
            assert_eq!(Cmd::from_u32(c as u32), Some(c));
            assert_eq!(request_size(c), c.request_size());
        }
        let ids: std::collections::HashSet<u32> = Cmd::ALL.iter().map(|&c| c as u32).collect();
        assert_eq!(ids.len(), Cmd::ALL.len(), "ids are unique");
        assert_eq!(Cmd::CreateQp.request_size(), size_of::<CreateQpReq>());
        assert_eq!(Cmd::ResizeCq.response_size(), size_of::<CreateCqResp>());
        assert_eq!(Cmd::AllocPd.request_size(), 0);
        assert_eq!(Cmd::ModifyQp.response_size(), 0);
        assert_eq!((Cmd::ReregMr.since_abi(), Cmd::PollCq.since_abi()), (1, 3));
        assert_eq!(<cmd::DestroyQp as Command>::CMD, Cmd::DestroyQp);
    }

    #[test]
    fn a_typed_command_round_trips_and_names_itself() {
        let req = HandleReq {
            handle: U32::new(42),
        };
        let msg = encode_command::<cmd::DestroyCq>(0, &req);
        let got = decode_request(&msg).unwrap();
        assert_eq!(got.resp_len, size_of::<EventsResp>());
        assert_eq!(got.read::<cmd::DestroyCq>(ABI).unwrap().handle.get(), 42);
        assert_eq!(
            got.read::<cmd::DestroySrq>(ABI).unwrap_err(),
            DecodeError::WrongCommand,
            "a request is read only as the command it is"
        );
        let resp = EventsResp {
            events_reported: U32::new(3),
        };
        let reply = encode_response(Cmd::DestroyCq as u32, 0, resp.as_bytes(), got.resp_len);
        let back = decode_reply::<cmd::DestroyCq>(&reply).unwrap().unwrap();
        assert_eq!(back.events_reported.get(), 3);
    }

    proptest::proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            if let Ok(req) = decode_request(&bytes) {
                let _ = req.body::<ModifyQpReq>(ABI);
                let _ = req.body::<CreateQpReq>(1);
            }
            let _ = decode_response::<QueryQpResp>(&bytes, Cmd::QueryQp);
        }
    }
}
