//! Jobs: a descriptor travelling with its session handle and its buffer.
//!
//! The buffer moves into the engine with the job and comes back with the
//! completion, so ownership says who may touch the bytes: while a job is in
//! flight, only the engine can. A job names its session by the handle the
//! engine issued at registration; it carries no keys and no reference count.

use std::fmt;

use strum::{Display, EnumString, IntoStaticStr, VariantArray, VariantNames};

use crate::buffer::PacketBuf;
use crate::descriptor::Descriptor;
use crate::session::{Session, SessionHandle};

/// One unit of work for an engine.
pub struct Job {
    /// The session whose keys the job runs with, as the engine issued it.
    pub session: SessionHandle,
    /// What to do, over which regions; its `status` is the engine's answer.
    pub desc: Descriptor,
    /// The packet, owned by the engine while the job is in flight.
    pub buf: PacketBuf,
    /// Where the descriptor's regions start in `buf.data()` (the ESP header).
    pub offset: usize,
    /// The submitter's cookie, returned untouched.
    pub user: u64,
    /// The per-request policy's bounce buffer while the job is in flight.
    pub(crate) bounce: Option<Vec<u8>>,
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("session", &self.session)
            .field("desc", &self.desc)
            .field("offset", &self.offset)
            .field("user", &self.user)
            .finish()
    }
}

impl Job {
    /// A job over `buf` whose descriptor's regions start at `offset` of its data, with the submitter's cookie `user`.
    #[inline]
    pub fn new(session: SessionHandle, desc: Descriptor, buf: PacketBuf, offset: usize, user: u64) -> Job {
        Job {
            session,
            desc,
            buf,
            offset,
            user,
            bounce: None,
        }
    }

    /// The bytes the descriptor's regions index.
    #[inline]
    pub fn region_bytes(&mut self) -> &mut [u8] {
        let offset = self.offset.min(self.buf.len());
        &mut self.buf.data_mut()[offset..]
    }

    /// Runs the descriptor here, in the calling thread, with `session`
    /// (the expanded keys its handle names), honouring the buffer policy:
    /// with `per-request` the bytes go through a freshly allocated bounce
    /// buffer, copied in and out, as a driver without registered memory must.
    /// Returns whether a bounce buffer was used.
    #[inline]
    pub fn run_with(&mut self, session: &Session, buffers: BufferPolicy) -> bool {
        if buffers == BufferPolicy::Registered && self.bounce.is_none() {
            let offset = self.offset.min(self.buf.len());
            crate::primitive::process(session, &mut self.desc, &mut self.buf.data_mut()[offset..]);
            return false;
        }
        if buffers == BufferPolicy::PerRequest {
            self.bounce_in();
        }
        let bounced = self.is_bounced();
        let Job {
            desc,
            buf,
            offset,
            bounce,
            ..
        } = self;
        let bytes: &mut [u8] = match bounce {
            Some(bounce) => bounce,
            None => {
                let offset = (*offset).min(buf.len());
                &mut buf.data_mut()[offset..]
            }
        };
        crate::primitive::process(session, desc, bytes);
        self.bounce_out();
        bounced
    }

    /// Copies the region into a new bounce buffer (the `per-request`
    /// policy's registration at submit), for engines that run the job later.
    pub fn bounce_in(&mut self) {
        if self.bounce.is_none() {
            self.bounce = Some(self.region_bytes().to_vec());
        }
    }

    /// Whether the job's bytes are in a bounce buffer.
    #[inline]
    pub fn is_bounced(&self) -> bool {
        self.bounce.is_some()
    }

    /// Drops a bounce buffer without copying it back (a failed job).
    pub fn discard_bounce(&mut self) {
        self.bounce = None;
    }

    /// Copies a bounce buffer's bytes back into the packet and frees it.
    #[inline]
    pub fn bounce_out(&mut self) {
        if let Some(bounce) = self.bounce.take() {
            let dst = self.region_bytes();
            let len = dst.len().min(bounce.len());
            dst[..len].copy_from_slice(&bounce[..len]);
        }
    }

    /// The bytes the engine computes over: the bounce buffer while there
    /// is one, the packet's regions otherwise.
    #[inline]
    pub fn work_bytes(&mut self) -> &mut [u8] {
        match self.bounce {
            Some(ref mut bounce) => bounce,
            None => {
                let offset = self.offset.min(self.buf.len());
                &mut self.buf.data_mut()[offset..]
            }
        }
    }
}

/// How the dataplane hands a packet's crypto to the engine.
///
/// Names (config `[accel] style`, `--style`, JSON) are the variants in
/// kebab case, derived once for strum and serde alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[derive(VariantArray, VariantNames, IntoStaticStr, EnumString, Display)]
#[strum(serialize_all = "kebab-case", parse_err_ty = UnknownStyle, parse_err_fn = UnknownStyle::new)]
pub enum Style {
    /// Low-level: the cipher, then the MAC, as two requests the caller
    /// waits for one after the other, packet by packet.
    Sync,
    /// Two descriptors per packet (cipher, then MAC); the second is
    /// submitted when the first completes; many packets in flight.
    DualPass,
    /// High-level: one single-pass descriptor per packet, many in flight,
    /// completions reaped in batches.
    #[default]
    Async,
}

crate::name_table!(Style);

crate::unknown_name!(
    /// A style name that is not known.
    UnknownStyle,
    Style,
    "submission style"
);

/// How packet bytes reach the engine (the TrustZone study's two cases).
///
/// Names (config `[accel] buffers`, `--buffers`, JSON) are the variants in
/// kebab case, derived once for strum and serde alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[derive(VariantArray, VariantNames, IntoStaticStr, EnumString, Display)]
#[strum(
    serialize_all = "kebab-case",
    parse_err_ty = UnknownBufferPolicy,
    parse_err_fn = UnknownBufferPolicy::new
)]
pub enum BufferPolicy {
    /// The pool is registered once; jobs carry buffer handles (zero copy).
    #[default]
    Registered,
    /// Each request allocates and registers a bounce buffer, copies the
    /// packet in and the result out, and releases it.
    PerRequest,
}

crate::name_table!(BufferPolicy);

crate::unknown_name!(
    /// A buffer policy name that is not known.
    UnknownBufferPolicy,
    BufferPolicy,
    "buffer policy"
);

#[cfg(test)]
mod tests {
    use super::*;

    /// The names are config values, CLI values and JSON text: deriving
    /// them must not rename one, and serde must agree with strum. A new
    /// style or policy is added here too.
    #[test]
    fn the_derived_names_are_the_published_keys() {
        crate::assert_published_names::<Style>(&["sync", "dual-pass", "async"]);
        assert_eq!(
            "batch".parse::<Style>().unwrap_err().to_string(),
            "unknown submission style `batch`; expected sync, dual-pass or async"
        );

        crate::assert_published_names::<BufferPolicy>(&["registered", "per-request"]);
        assert_eq!(
            "pinned".parse::<BufferPolicy>().unwrap_err().to_string(),
            "unknown buffer policy `pinned`; expected registered or per-request"
        );
    }
}
