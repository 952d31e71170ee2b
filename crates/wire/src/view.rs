//! The boilerplate shared by every fixed-size header view (smoltcp `wire` style).

/// Declares a zero-copy view `$name<T: AsRef<[u8]>>` over a fixed-length header with
/// `LEN`, `new_unchecked`, `new_checked`, `check_len`, `into_inner` and `as_bytes`.
macro_rules! header_view {
    ($(#[$meta:meta])* $name:ident, $kind:expr) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Length of this header on the wire, in bytes.
            pub const LEN: usize = $kind.wire_len();

            /// Wraps a buffer without looking at its length. Getters and setters panic if
            /// the buffer is shorter than [`Self::LEN`]; use [`Self::new_checked`] on
            /// untrusted input.
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps a buffer after checking it holds the whole header.
            pub fn new_checked(buffer: T) -> Result<Self, $crate::WireError> {
                let view = Self::new_unchecked(buffer);
                view.check_len()?;
                Ok(view)
            }

            /// Fails with [`WireError::Truncated`](crate::WireError::Truncated) if the
            /// buffer is shorter than [`Self::LEN`]. Trailing bytes are allowed: the view
            /// only looks at the first `LEN`.
            pub fn check_len(&self) -> Result<(), $crate::WireError> {
                let available = self.buffer.as_ref().len();
                if available < Self::LEN {
                    Err($crate::WireError::Truncated {
                        header: $kind,
                        needed: Self::LEN,
                        available,
                    })
                } else {
                    Ok(())
                }
            }

            /// Gives the buffer back.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            /// The header's own bytes (the first [`Self::LEN`] of the buffer).
            pub fn as_bytes(&self) -> &[u8] {
                &self.buffer.as_ref()[..Self::LEN]
            }
        }
    };
}

pub(crate) use header_view;
