//! What the workers share to open a deleted device's sockets again once a
//! device of that name is back: where fresh packet sockets come from (a
//! process that gave up `CAP_NET_RAW` cannot make them itself), the fanout
//! groups the workers join anew, and the steering programs those groups
//! are given.
//!
//! A fanout group of `PACKET_FANOUT_CBPF` hands a frame to its `k`-th
//! member by the program's value, so the workers must join a device's new
//! group in their order, 0 first, as they joined at start; worker 0's
//! socket asks the kernel for a group id no other group has, and the
//! others join that id. Until the group is whole each reopened member
//! drops every frame ([`AfPacket::reopen`]); the last to join installs the
//! latest steering program.
//!
//! Owns that bookkeeping only; the worker loop ([`crate::run`]) decides when
//! to reopen. Must not create sockets itself or touch the gateway.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};

use dataplane::route::Port;

use crate::afpacket::AfPacket;
use crate::steer::Insn;

/// Where a process without `CAP_NET_RAW` gets fresh packet sockets.
pub trait SocketSource: Send + Sync {
    /// A new `AF_PACKET`, `SOCK_RAW` socket of protocol 0 (it receives
    /// nothing until bound), nonblocking and close-on-exec.
    fn packet_socket(&self) -> io::Result<OwnedFd>;
}

/// What a worker does when the device of one of its interfaces is deleted.
pub enum OnDeviceLoss {
    /// It stops with [`DeviceLost::Deleted`](crate::run::DeviceLost), for a
    /// service manager to start the gateway again.
    Exit,
    /// It keeps its gateway, waits for a device of that name without
    /// polling the lost sockets, and opens them again.
    Wait(Rejoin),
}

/// The sockets' state every worker of a process shares.
pub struct Reopener {
    shared: Arc<Shared>,
}

struct Shared {
    source: Box<dyn SocketSource>,
    workers: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The groups being joined or joined since start, one per port at
    /// most: a device's newest.
    groups: [Option<Group>; 2],
    /// The latest steering program of each port's group.
    programs: [Option<Vec<Insn>>; 2],
}

/// A fanout group made for one device (by its index).
#[derive(Debug, Clone, Copy)]
struct Group {
    ifindex: u32,
    /// Its id, once worker 0 has made it.
    id: Option<u16>,
    /// Workers that have joined it (workers `0..joined`).
    joined: usize,
}

/// Where a worker stands in its port's new group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Joined {
    /// Not its turn yet: a worker before it has not joined.
    Waiting,
    /// In the group, which is not whole yet.
    Member,
    /// In the group, and every worker is.
    Whole,
}

impl Reopener {
    /// For `workers` workers, with sockets from `source`.
    pub fn new(source: Box<dyn SocketSource>, workers: usize) -> Reopener {
        Reopener {
            shared: Arc::new(Shared {
                source,
                workers,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// Worker `index`'s handle.
    pub fn worker(&self, index: usize) -> Rejoin {
        Rejoin {
            shared: Arc::clone(&self.shared),
            worker: index,
        }
    }
}

/// One worker's handle on the shared state (see [`Reopener`]).
#[derive(Clone)]
pub struct Rejoin {
    shared: Arc<Shared>,
    worker: usize,
}

impl Rejoin {
    fn state(&self) -> MutexGuard<'_, State> {
        // A worker that panicked holding the lock left nothing half-done
        // that matters more than going on.
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh packet socket (see [`SocketSource`]).
    pub fn packet_socket(&self) -> io::Result<OwnedFd> {
        self.shared.source.packet_socket()
    }

    /// Joins `socket` (reopened on device `ifindex`, see
    /// [`AfPacket::reopen`]) to its port's new group if it is this worker's
    /// turn, and says where it stands. The last worker to join installs
    /// the port's latest steering program on the group.
    pub fn join(&self, port: Port, ifindex: u32, socket: &mut AfPacket) -> io::Result<Joined> {
        let workers = self.shared.workers;
        let mut state = self.state();
        let State { groups, programs } = &mut *state;
        let slot = &mut groups[port.index()];
        // A newer device than the one the group was made for: a new group
        // (the workers in the old one find their device gone too).
        if !matches!(slot, Some(g) if g.ifindex == ifindex) {
            *slot = None;
        }
        let group = slot.get_or_insert(Group {
            ifindex,
            id: None,
            joined: 0,
        });
        if !socket.in_fanout() {
            if group.joined != self.worker {
                return Ok(Joined::Waiting);
            }
            let id = socket.join_fanout(group.id)?;
            group.id = Some(id);
            group.joined += 1;
            if group.joined == workers {
                if let Some(program) = &programs[port.index()] {
                    socket.set_steering(program)?;
                }
            }
        }
        Ok(if group.joined >= workers {
            Joined::Whole
        } else {
            Joined::Member
        })
    }

    /// Records `program` as `port`'s latest steering program and has
    /// `install` put it on this worker's socket of the port, under the one
    /// lock, so that a group made whole meanwhile gets this program and not
    /// an older one.
    pub fn steer(
        &self,
        port: Port,
        program: &[Insn],
        install: impl FnOnce(&[Insn]) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut state = self.state();
        state.programs[port.index()] = Some(program.to_vec());
        install(program)
    }
}
