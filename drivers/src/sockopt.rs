//! Socket options, as both the AF_PACKET socket ([`crate::afpacket`])
//! and its receive ring ([`crate::ring`]) set and read them: `accel`'s
//! wrappers of `setsockopt` and `getsockopt`, which the shared engine and
//! the binary use too. It lives apart from both so that the socket depends
//! on the ring and never the other way round.
//!
//! Owns the names only; which options to set is its callers'.

pub(crate) use accel::os::{get_sockopt as get_option, set_sockopt as set_option};
