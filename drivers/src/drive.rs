//! Waiting for the engine: the driver's side of the sans-IO core.
//!
//! The gateway never waits; these helpers do, for drivers that handle a
//! frame or a capture at a time (offline `pcap`, tests, the benchmark's
//! set-up, shutdown). They let time pass the way the engine says it does:
//! to a modelled engine's next completion time, or by blocking on a real
//! device (`Engine::wait`) and reading the wall clock. Owns no state; must
//! not be called from the core.

use std::time::{Duration, Instant};

use accel::NextCompletion;

use dataplane::buffer::{PacketBuf, PacketPool};
use dataplane::gateway::{Gateway, Output, JOB_TIMEOUT};
use dataplane::route::Port;

/// How long one blocking wait on a real device may last.
const DEVICE_WAIT: Duration = Duration::from_millis(1);

/// Runs the gateway until nothing is in flight, starting at `*now` and
/// leaving `*now` at the time the last job finished: a modelled engine's
/// completion times, or `*now` plus the wall-clock time spent waiting on a
/// device. Jobs an engine never returns are reclaimed after
/// [`JOB_TIMEOUT`] (of that same time) and dropped as `engine_timeout`, so
/// every buffer comes back.
pub fn settle(gateway: &mut Gateway, now: &mut Duration, out: &mut Vec<Output>, pool: &mut PacketPool) {
    let started = Instant::now();
    // Time never runs backwards for the gateway (or a modelled engine that
    // has already been driven further).
    *now = (*now).max(gateway.now());
    let base = *now;
    while gateway.in_flight() > 0 {
        gateway.poll(*now, out, pool);
        if gateway.in_flight() == 0 {
            break;
        }
        match gateway.next_completion() {
            NextCompletion::Ready => continue,
            NextCompletion::At(t) => *now = (*now).max(t),
            NextCompletion::External => {
                gateway.engine_mut().wait(DEVICE_WAIT);
                *now = (*now).max(base + started.elapsed());
            }
            // Nothing will come back by itself (lost completions, or
            // packets held behind them): on to the gateway's next deadline,
            // where the timeout reclaims them.
            NextCompletion::Idle => {
                let deadline = gateway.poll_timeout().unwrap_or(*now + JOB_TIMEOUT);
                *now = deadline.max(*now + Duration::from_millis(1));
            }
        }
        if now.saturating_sub(base) > JOB_TIMEOUT || gateway.next_completion() == NextCompletion::Idle {
            gateway.handle_timeout(*now, out, pool);
        }
        // A device that never gives its jobs back: they were abandoned
        // (and dropped as `engine_timeout` when they come); stop waiting.
        if now.saturating_sub(base) > JOB_TIMEOUT * 40 {
            break;
        }
    }
}

/// [`settle`] from `now`, for callers that do not keep the clock.
pub fn flush(gateway: &mut Gateway, now: Duration, out: &mut Vec<Output>, pool: &mut PacketPool) {
    let mut now = now;
    settle(gateway, &mut now, out, pool);
}

/// One frame, start to finish, for tools and tests that handle frames one
/// at a time: waits for the engine if the frame needs crypto. Returns
/// everything the gateway sent because of it (usually one frame; an ARP
/// request and fragments add more).
pub fn handle_frame(
    gateway: &mut Gateway,
    now: Duration,
    from: Port,
    buf: PacketBuf,
    pool: &mut PacketPool,
) -> Vec<Output> {
    let mut bufs = vec![buf];
    let mut out = Vec::with_capacity(1);
    gateway.handle_batch(now, from, &mut bufs, &mut out, pool);
    if gateway.in_flight() > 0 {
        flush(gateway, now, &mut out, pool);
    }
    out
}

/// Waits for the engine, then stops the gateway (see [`Gateway::shutdown`]).
pub fn shutdown(gateway: &mut Gateway, now: Duration, out: &mut Vec<Output>, pool: &mut PacketPool) {
    let mut now = now;
    settle(gateway, &mut now, out, pool);
    gateway.shutdown(now, out, pool);
}
