//! Inline-payload slots of a direct channel (ABI 14, docs/design/direct-path.md "Small SENDs"): a
//! SEND of at most [`INLINE_MAX`] bytes is not copied into the receiver by the sender (that
//! would be a system call on the receiver's `/proc/<pid>/mem`); the sender leaves the bytes,
//! and where they go, in the slot that belongs to the receive completion it pushes, and the
//! receiver's library copies them into its own receive buffer when it takes the completion.
//!
//! Slot `i % capacity` of a side belongs to entry `i` of that side's receive-completion
//! ring. Its state word says who may touch it: the sender fills a [`SLOT_FREE`] slot and
//! marks it [`SLOT_FILLED`] before it pushes the completion; whoever places the bytes first
//! takes it with a compare-and-swap (the receiver at its poll: [`SLOT_RECEIVER`]; the sender
//! before it places anything else into the receiver's memory: [`SLOT_SENDER`]) and marks it
//! free when the bytes are in place. The receiver hands out the completion only once its
//! slot is free again, so data placed later by the sender never lands under older inline
//! bytes placed after it.
//!
//! Layout of a slot (little-endian): state `u32`, number of pieces `u32`, payload bytes
//! `u32`, payload offset `u32` ([`SLOT_PAYLOAD_AT`]: 0 is [`SLOT_PAYLOAD`]), then [`INLINE_PIECES`] pieces of 16 bytes (L_Key `u32`, length `u32`,
//! address as the receive's SGE names it `u64`), then the payload at [`SLOT_PAYLOAD`].

/// Payload bytes a slot carries at most.
pub const INLINE_MAX: usize = 256;
/// Receive SGEs a slot can name at most (a SEND reaching more of them is placed by the
/// sender).
pub const INLINE_PIECES: usize = 4;
/// Byte offset of the state word in a slot.
pub const SLOT_STATE: usize = 0;
/// Byte offset of the number of pieces.
pub const SLOT_NPIECES: usize = 4;
/// Byte offset of the payload length.
pub const SLOT_LEN: usize = 8;
/// Byte offset of the first piece.
pub const SLOT_PIECES: usize = 16;
/// Bytes per piece.
pub const PIECE: usize = 16;
/// Byte offset of the payload.
pub const SLOT_PAYLOAD: usize = 128;
/// Byte offset of the slot's payload-offset word: 0 puts the payload at [`SLOT_PAYLOAD`];
/// [`SLOT_NEAR`] right behind the pieces, in the slot's first 128 bytes, which a
/// receiver that says [`INLINE_NEAR`] reads (ABI 15 libraries of issue 16; a small SEND
/// then reaches the receiver in the lines it reads anyway).
pub const SLOT_PAYLOAD_AT: usize = 12;
/// Where a near payload starts: right behind the first piece, or behind all four (see
/// [`near_offset`]).
pub const SLOT_NEAR: [usize; 2] = [SLOT_PIECES + PIECE, SLOT_PIECES + INLINE_PIECES * PIECE];
/// What a receiver that reads near payloads writes to its `CH_INLINE` word (1: it places
/// inline slots, payload at [`SLOT_PAYLOAD`] only).
pub const INLINE_NEAR: u32 = 2;

/// What a receiver writes to its `CH_INLINE` word when, besides reading near payloads, it
/// frees a slot before it pops the slot's ring entry (issue 16): a sender that has seen the
/// consumer index pass entry `i` then knows slot `i % capacity` is free without reading the
/// slot's state, a line the receiver wrote last. A sender of [`INLINE_NEAR`] libraries reads
/// this as "not near" and places payloads at [`SLOT_PAYLOAD`] (correct, slower).
pub const INLINE_FREES_FIRST: u32 = 3;

/// Where a payload of `len` bytes for `pieces` receive SGEs can sit within the slot's first
/// 128 bytes: behind one piece within the first 64-byte line, else behind all four; `None`
/// when it does not fit there.
pub const fn near_offset(pieces: usize, len: usize) -> Option<usize> {
    if pieces <= 1 && SLOT_NEAR[0] + len <= 64 {
        Some(SLOT_NEAR[0])
    } else if pieces <= INLINE_PIECES && SLOT_NEAR[1] + len <= SLOT_PAYLOAD {
        Some(SLOT_NEAR[1])
    } else {
        None
    }
}
/// Bytes per slot (a multiple of 128, so state words never share a cache line).
pub const INLINE_SLOT: usize = SLOT_PAYLOAD + INLINE_MAX;

/// Nothing in the slot (placed, or never used).
pub const SLOT_FREE: u32 = 0;
/// Filled by the sender, not placed yet.
pub const SLOT_FILLED: u32 = 1;
/// The receiver is placing it.
pub const SLOT_RECEIVER: u32 = 2;
/// The sender is placing it.
pub const SLOT_SENDER: u32 = 3;
/// The sender took it but could not place the bytes (the receive's MR was deregistered
/// meanwhile): the receiver completes that receive `LOC_PROT_ERR` and frees the slot.
pub const SLOT_FAILED: u32 = 4;

const _: () = assert!(SLOT_PIECES + INLINE_PIECES * PIECE <= SLOT_PAYLOAD);
const _: () = assert!(INLINE_SLOT % 128 == 0);
