//! Which worker the kernel hands an inside frame to: a classic BPF program
//! for the inside fanout group (`PACKET_FANOUT_CBPF`) that walks the
//! outbound policies as the SPD does (first match wins) and sends every
//! packet that a policy protects to the worker owning its SA
//! ([`spd_sad::owner_worker`]), so that each outbound SA is fed by one
//! worker: its sequence numbers leave in order, and the peer's replay
//! window never sees one worker's numbers fall behind another's. Bypassed
//! and unmatched traffic is spread by a hash of its addresses.
//!
//! The outside has its own program ([`outside_program`]): every ESP
//! packet, raw or in UDP on an encapsulation port (RFC 3948), goes to the
//! worker that owns its inbound SA ([`spd_sad::inbound_owner`], by SPI),
//! so that one replay window sees all of an SA's packets. Without it, the
//! kernel's flow hash would send a packet with a spoofed source address
//! or port to another worker, whose copy of the window had not seen its
//! sequence number: a replay accepted. The outside group also reassembles
//! fragments before steering (`PACKET_FANOUT_FLAG_DEFRAG`), since only a
//! first fragment has the SPI.
//!
//! Pure: the programs are built from the SPD and SAD; the driver installs
//! them ([`AfPacket::set_steering`](crate::afpacket::AfPacket::set_steering)).

use spd_sad::{
    owner_worker, proto, Action, IpPrefix, PolicyDirection, PortRange, ProtocolSelector, Sad, Spd,
};

/// `ret A`'s value is taken modulo the group's size by the kernel
/// (`fanout_demux_bpf`): an SPI returned as it is lands on
/// [`spd_sad::inbound_owner`].
fn insn(code: u16, jt: u8, jf: u8, k: u32) -> Insn {
    Insn { code, jt, jf, k }
}

/// Most encapsulation ports the outside program tests (its jumps are one
/// byte).
pub const MAX_NAT_PORTS: usize = 200;

/// The outside fanout program: ESP (IP protocol 50) by its SPI; UDP to one
/// of `nat_ports` carrying ESP (not the non-ESP marker of IKE) by the SPI
/// after the UDP header; everything else by a hash of its addresses.
pub fn outside_program(nat_ports: &[u16]) -> Result<Vec<Insn>, SteerError> {
    let ports = nat_ports.len();
    if ports > MAX_NAT_PORTS {
        return Err(SteerError::TooManyPorts(ports));
    }
    let mut program = vec![
        // A = the protocol.
        insn(LD | B | ABS, 0, 0, NET + 9),
    ];
    // Layout, with P ports: [0] A = protocol; [1] ESP? to [9+P]; [2] UDP?
    // else to the hash at [12+P]; [3] X = header length; [4] A = destination
    // port; [5..5+P] one test per port, to [6+P]; [5+P] to the hash; [6+P]
    // A = the word after the UDP header; [7+P] zero (IKE) to the hash;
    // [8+P] return it; [9+P] X = header length; [10+P] A = the SPI; [11+P]
    // return it; [12+P..] the hash.
    let udp_len = 2 + ports + 1 + 3;
    program.push(insn(JMP | JEQ | K, (1 + udp_len) as u8, 0, u32::from(proto::ESP)));
    program.push(insn(JMP | JEQ | K, 0, (udp_len + 3) as u8, u32::from(proto::UDP)));
    program.push(insn(LDX | B | MSH, 0, 0, NET));
    program.push(insn(LD | H | IND, 0, 0, NET + 2));
    for (i, port) in nat_ports.iter().enumerate() {
        // On a match: past the other port tests and the `ja`.
        program.push(insn(JMP | JEQ | K, (ports - i) as u8, 0, u32::from(*port)));
    }
    program.push(insn(JMP | JA, 0, 0, 3 + 3));
    program.push(insn(LD | W | IND, 0, 0, NET + 8));
    // Four zero bytes: IKE behind the non-ESP marker, spread like the rest.
    program.push(insn(JMP | JEQ | K, 4, 0, 0));
    program.push(insn(RET | RET_A, 0, 0, 0));
    program.push(insn(LDX | B | MSH, 0, 0, NET));
    program.push(insn(LD | W | IND, 0, 0, NET));
    program.push(insn(RET | RET_A, 0, 0, 0));
    program.extend_from_slice(&address_hash());
    Ok(program)
}

/// What is not steered to an owner: spread by a hash of the addresses.
fn address_hash() -> [Insn; 8] {
    [
        insn(LD | W | ABS, 0, 0, NET + 12),
        insn(MISC | TAX, 0, 0, 0),
        insn(LD | W | ABS, 0, 0, NET + 16),
        insn(ALU | XOR | X, 0, 0, 0),
        insn(MISC | TAX, 0, 0, 0),
        insn(ALU | RSH | K, 0, 0, 16),
        insn(ALU | XOR | X, 0, 0, 0),
        insn(RET | RET_A, 0, 0, 0),
    ]
}

/// One classic BPF instruction (`struct sock_filter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    /// The opcode: class, size, mode or operation, source (`BPF_*`).
    pub code: u16,
    /// Instructions to skip when a conditional jump's test holds.
    pub jt: u8,
    /// Instructions to skip when it does not.
    pub jf: u8,
    /// The operand: a constant, an offset into the frame, or a jump's
    /// length for `ja`.
    pub k: u32,
}

/// Most instructions the kernel takes in a classic program (`BPF_MAXINSNS`).
pub const MAX_INSNS: usize = 4096;

/// Why no steering program could be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SteerError {
    /// The inside program for these outbound policies would be longer
    /// than the kernel takes ([`MAX_INSNS`]).
    #[error("{policies} outbound policies need a steering program of {insns} instructions, more than the kernel's {MAX_INSNS}; merge policies or run with --workers 1")]
    TooLong {
        /// Outbound policies the program walks.
        policies: usize,
        /// Instructions it would need.
        insns: usize,
    },
    /// More encapsulation ports than the outside program tests
    /// ([`MAX_NAT_PORTS`]).
    #[error("{0} UDP encapsulation ports are more than the outside steering program's {MAX_NAT_PORTS}; use fewer `udp_port` values or run with --workers 1")]
    TooManyPorts(usize),
}

// Classic BPF encodings (linux/bpf_common.h, linux/filter.h).
const LD: u16 = 0x00;
const LDX: u16 = 0x01;
const ALU: u16 = 0x04;
const JMP: u16 = 0x05;
const RET: u16 = 0x06;
const MISC: u16 = 0x07;
const W: u16 = 0x00;
const H: u16 = 0x08;
const B: u16 = 0x10;
const ABS: u16 = 0x20;
const IND: u16 = 0x40;
const MSH: u16 = 0xa0;
const AND: u16 = 0x50;
const RSH: u16 = 0x70;
const XOR: u16 = 0xa0;
const JA: u16 = 0x00;
const JEQ: u16 = 0x10;
const JGT: u16 = 0x20;
const JGE: u16 = 0x30;
const JSET: u16 = 0x40;
const K: u16 = 0x00;
const X: u16 = 0x08;
const RET_A: u16 = 0x10;
const TAX: u16 = 0x00;
/// `SKF_NET_OFF`: loads relative to the network (IPv4) header, wherever
/// the kernel's data pointer stands when the fanout runs.
const NET: u32 = (-0x10_0000i32) as u32;

/// A jump target while a policy's block is being built.
#[derive(Clone, Copy)]
enum To {
    Next,
    /// Past this many of the following instructions.
    Skip(u8),
    Fail,
}

/// One policy's tests: instructions whose conditional jumps go on to the
/// next test or to the end of the block (the next policy).
struct Block {
    insns: Vec<(Insn, To, To)>,
}

impl Block {
    fn op(&mut self, code: u16, k: u32) {
        self.insns.push((
            Insn {
                code,
                jt: 0,
                jf: 0,
                k,
            },
            To::Next,
            To::Next,
        ));
    }

    fn jump(&mut self, code: u16, k: u32, jt: To, jf: To) {
        self.insns.push((
            Insn {
                code,
                jt: 0,
                jf: 0,
                k,
            },
            jt,
            jf,
        ));
    }

    /// An IPv4 prefix test (`any` tests nothing; callers leave out
    /// IPv6-only policies, which this IPv4 program never sees).
    fn prefix(&mut self, offset: u32, prefix: IpPrefix) {
        let IpPrefix::V4(prefix) = prefix else {
            return;
        };
        if prefix.mask() == 0 {
            return;
        }
        self.op(LD | W | ABS, NET + offset);
        if prefix.mask() != u32::MAX {
            self.op(ALU | AND | K, prefix.mask());
        }
        self.jump(JMP | JEQ | K, u32::from(prefix.addr()), To::Next, To::Fail);
    }

    fn ports(&mut self, offset: u32, range: PortRange) {
        self.op(LD | H | IND, NET + offset);
        if range.first > 0 {
            self.jump(JMP | JGE | K, u32::from(range.first), To::Next, To::Fail);
        }
        if range.last < u16::MAX {
            self.jump(JMP | JGT | K, u32::from(range.last), To::Fail, To::Next);
        }
    }

    /// The block's instructions, jumps resolved, then `tail` (run on a match).
    fn finish(self, tail: &[Insn]) -> Vec<Insn> {
        let len = self.insns.len() + tail.len();
        let mut out = Vec::with_capacity(len);
        for (i, (mut insn, jt, jf)) in self.insns.into_iter().enumerate() {
            let resolve = |to: To| match to {
                To::Next => 0,
                To::Skip(n) => n,
                // Blocks are short (at most 25 instructions): within reach.
                To::Fail => (len - i - 1) as u8,
            };
            insn.jt = resolve(jt);
            insn.jf = resolve(jf);
            out.push(insn);
        }
        out.extend_from_slice(tail);
        out
    }
}

/// The inside fanout program for `workers` workers.
pub fn inside_program<C>(spd: &Spd, sad: &Sad<C>, workers: usize) -> Result<Vec<Insn>, SteerError> {
    let policies = spd.policies(PolicyDirection::Out).len();
    let mut blocks = Vec::with_capacity(policies);
    for policy in spd.policies(PolicyDirection::Out) {
        let s = &policy.selector;
        // The program reads IPv4 headers only.
        if !s.families().is_ok_and(|f| f.contains(&spd_sad::Family::V4)) {
            continue;
        }
        let mut block = Block { insns: Vec::new() };
        block.prefix(12, s.src);
        block.prefix(16, s.dst);
        if let ProtocolSelector::Number(n) = s.protocol {
            block.op(LD | B | ABS, NET + 9);
            block.jump(JMP | JEQ | K, u32::from(n), To::Next, To::Fail);
        }
        if !(s.src_ports.is_any() && s.dst_ports.is_any()) {
            // Ports exist only in TCP, UDP and SCTP first fragments
            // (RFC 4301 §4.4.1.1 OPAQUE), as `wire::flow::flow_key` reads them.
            block.op(LD | H | ABS, NET + 6);
            block.jump(JMP | JSET | K, 0x1fff, To::Fail, To::Next);
            block.op(LD | B | ABS, NET + 9);
            block.jump(JMP | JEQ | K, u32::from(proto::TCP), To::Skip(2), To::Next);
            block.jump(JMP | JEQ | K, u32::from(proto::UDP), To::Skip(1), To::Next);
            block.jump(JMP | JEQ | K, u32::from(proto::SCTP), To::Next, To::Fail);
            block.op(LDX | B | MSH, NET);
            block.ports(0, s.src_ports);
            block.ports(2, s.dst_ports);
        }
        let owner = match policy.action {
            Action::Protect(id) => sad
                .get(id)
                .map(|sa| owner_worker(sa.params().local, sa.params().remote, workers)),
            Action::Bypass | Action::Discard => None,
        };
        blocks.push((block, owner));
    }
    let hash = address_hash();
    // Each block ends in a `ret` or a jump to the hash: its length is its
    // tests plus one.
    let total: usize = blocks.iter().map(|(b, _)| b.insns.len() + 1).sum::<usize>() + hash.len();
    if total > MAX_INSNS {
        return Err(SteerError::TooLong {
            policies,
            insns: total,
        });
    }
    let mut program = Vec::with_capacity(total);
    for (block, owner) in blocks {
        let tail = match owner {
            Some(worker) => Insn {
                code: RET | K,
                jt: 0,
                jf: 0,
                k: worker as u32,
            },
            None => {
                // To the hash: past the rest of this block's tail and every
                // later block.
                let after = program.len() + block.insns.len() + 1;
                let later = total - hash.len() - after;
                Insn {
                    code: JMP | JA,
                    jt: 0,
                    jf: 0,
                    k: later as u32,
                }
            }
        };
        program.extend(block.finish(&[tail]));
    }
    program.extend_from_slice(&hash);
    Ok(program)
}

#[cfg(test)]
mod tests {
    use super::*;
    use spd_sad::{FlowKey, Ipv4Prefix, Lifetime, Mode, Policy, SaDirection, SaParams, Selector};
    use std::net::{IpAddr, Ipv4Addr};

    /// A classic BPF interpreter for what [`inside_program`] emits, over an
    /// IPv4 packet (network header at 0); `None` where the kernel would
    /// stop (a load past the end returns 0 there).
    fn run(program: &[Insn], packet: &[u8]) -> Option<u32> {
        let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
        let load = |at: u32, size: usize| -> Option<u32> {
            let at = at.wrapping_sub(NET) as usize;
            let bytes = packet.get(at..at + size)?;
            Some(bytes.iter().fold(0, |v, b| (v << 8) | u32::from(*b)))
        };
        loop {
            let i = *program.get(pc)?;
            pc += 1;
            let jump = |cond: bool, pc: &mut usize| *pc += usize::from(if cond { i.jt } else { i.jf });
            match i.code {
                c if c == LD | W | ABS => a = load(i.k, 4)?,
                c if c == LD | H | ABS => a = load(i.k, 2)?,
                c if c == LD | B | ABS => a = load(i.k, 1)?,
                c if c == LD | H | IND => a = load(i.k.wrapping_add(x), 2)?,
                c if c == LD | W | IND => a = load(i.k.wrapping_add(x), 4)?,
                c if c == LDX | B | MSH => x = 4 * (load(i.k, 1)? & 0xf),
                c if c == ALU | AND | K => a &= i.k,
                c if c == ALU | RSH | K => a >>= i.k,
                c if c == ALU | XOR | X => a ^= x,
                c if c == MISC | TAX => x = a,
                c if c == JMP | JA => pc += i.k as usize,
                c if c == JMP | JEQ | K => jump(a == i.k, &mut pc),
                c if c == JMP | JGT | K => jump(a > i.k, &mut pc),
                c if c == JMP | JGE | K => jump(a >= i.k, &mut pc),
                c if c == JMP | JSET | K => jump(a & i.k != 0, &mut pc),
                c if c == RET | K => return Some(i.k),
                c if c == RET | RET_A => return Some(a),
                other => panic!("unexpected opcode {other:#x}"),
            }
        }
    }

    fn packet(flow: &FlowKey, frag_offset: u16) -> Vec<u8> {
        let mut p = vec![0u8; 28];
        p[0] = 0x45;
        p[6..8].copy_from_slice(&frag_offset.to_be_bytes());
        p[9] = flow.protocol;
        let octets = |a: IpAddr| match a {
            IpAddr::V4(a) => a.octets(),
            IpAddr::V6(_) => panic!("an IPv4 program's test flow"),
        };
        p[12..16].copy_from_slice(&octets(flow.src));
        p[16..20].copy_from_slice(&octets(flow.dst));
        let (sp, dp) = flow.ports.unwrap_or((7, 7));
        p[20..22].copy_from_slice(&sp.to_be_bytes());
        p[22..24].copy_from_slice(&dp.to_be_bytes());
        p
    }

    fn sa(sad: &mut Sad<()>, name: &str, remote: [u8; 4]) -> spd_sad::SaId {
        let params = SaParams {
            name: name.into(),
            direction: SaDirection::Outbound,
            spi: 0x1000 + sad.len() as u32,
            mode: Mode::Tunnel,
            local: Ipv4Addr::new(10, 0, 0, 1).into(),
            remote: remote.into(),
            esn: false,
            replay_window: 64,
            lifetime: Lifetime::default(),
            encap: None,
            selectors: Vec::new(),
        };
        sad.insert(params, (), std::time::Duration::ZERO).unwrap()
    }

    fn policy(name: &str, selector: Selector, action: Action) -> Policy {
        Policy {
            name: name.into(),
            direction: PolicyDirection::Out,
            priority: 0,
            selector,
            action,
        }
    }

    /// Against the SPD's own lookup, over flows of every kind: a protected
    /// flow reaches its SA's owner, always.
    #[test]
    fn protected_packets_reach_their_sas_owner() {
        let mut sad = Sad::new();
        let mut spd = Spd::new();
        let sas: Vec<_> = (0..6)
            .map(|i| sa(&mut sad, &format!("sa{i}"), [10, 0, i, 2]))
            .collect();
        let net = |a: [u8; 4], len: u8| IpPrefix::V4(Ipv4Prefix::new(a.into(), len).unwrap());
        let sel = |src, dst, protocol, sp: (u16, u16), dp: (u16, u16)| Selector {
            src,
            dst,
            protocol,
            src_ports: PortRange {
                first: sp.0,
                last: sp.1,
            },
            dst_ports: PortRange {
                first: dp.0,
                last: dp.1,
            },
        };
        let any = (0, u16::MAX);
        let tcp = ProtocolSelector::Number(proto::TCP);
        let all = ProtocolSelector::Any;
        let udp = ProtocolSelector::Number(proto::UDP);
        let (web, dns, high) = ((80, 443), (53, 53), (1024, u16::MAX));
        let (lan1, lan2) = (net([192, 168, 1, 0], 24), net([192, 168, 2, 0], 24));
        let host3 = IpPrefix::V4(Ipv4Prefix::host([192, 168, 3, 7].into()));
        let (lan4, sites) = (net([192, 168, 4, 0], 24), net([192, 168, 0, 0], 16));
        let any_ip = IpPrefix::Any;
        let protect = |i: usize| Action::Protect(sas[i]);
        // (name, source, destination, protocol, source ports, destination
        // ports, action), in SPD order.
        let table = [
            ("web", lan1, lan2, tcp, any, web, protect(0)),
            ("bypass-dns", any_ip, any_ip, udp, any, dns, Action::Bypass),
            ("high", any_ip, lan2, all, high, any, protect(1)),
            ("net2", lan1, lan2, all, any, any, protect(2)),
            ("host3", any_ip, host3, all, any, any, protect(3)),
            ("drop4", any_ip, lan4, all, any, any, Action::Discard),
            ("rest", sites, sites, all, any, any, protect(4)),
        ];
        for (name, src, dst, protocol, sp, dp, action) in table {
            spd.insert(policy(name, sel(src, dst, protocol, sp, dp), action));
        }
        for workers in [2usize, 3, 4] {
            let owners: std::collections::HashSet<usize> = sad
                .iter()
                .map(|(_, sa)| owner_worker(sa.params().local, sa.params().remote, workers))
                .collect();
            assert!(owners.len() > 1, "the SAs have different owners");
            let program = inside_program(&spd, &sad, workers).unwrap();
            let mut rng = 0x2545_f491_4f6c_dd1du64;
            let mut next = || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            let mut protected = 0;
            for _ in 0..20_000 {
                let r = next();
                let host = |r: u64| Ipv4Addr::new(192, 168, (r % 5) as u8, ((r >> 8) % 8) as u8);
                let protocol = [proto::TCP, proto::UDP, proto::ICMP, proto::SCTP, 47][(r >> 16) as usize % 5];
                let fragment = (r >> 20) % 4 == 0;
                let offset = if fragment { ((r >> 24) % 3) as u16 } else { 0 };
                let port = |r: u64| [0u16, 53, 80, 443, 1023, 1024, 8080, 65535][(r % 8) as usize];
                let ports = matches!(protocol, proto::TCP | proto::UDP | proto::SCTP) && offset == 0;
                let flow = FlowKey {
                    src: host(r >> 28).into(),
                    dst: host(r >> 36).into(),
                    protocol,
                    ports: ports.then(|| (port(r >> 44), port(r >> 52))),
                };
                let got = run(&program, &packet(&flow, offset)).expect("the program returns");
                if let Action::Protect(id) = spd.lookup(PolicyDirection::Out, &flow).action {
                    let params = sad.get(id).unwrap().params();
                    assert_eq!(
                        got as usize % workers,
                        owner_worker(params.local, params.remote, workers),
                        "{flow:?} fragment offset {offset}"
                    );
                    protected += 1;
                }
            }
            assert!(
                protected > 5_000,
                "the flows exercise the protect policies: {protected}"
            );
        }
    }

    #[test]
    fn bypassed_traffic_is_spread_by_its_addresses() {
        let sad: Sad<()> = Sad::new();
        let spd = Spd::new();
        let program = inside_program(&spd, &sad, 2).unwrap();
        let mut seen = [0u32; 2];
        for i in 0..64u8 {
            let flow = FlowKey {
                src: Ipv4Addr::new(192, 168, 1, i).into(),
                dst: Ipv4Addr::new(192, 168, 2, 20).into(),
                protocol: proto::UDP,
                ports: Some((1, 2)),
            };
            seen[run(&program, &packet(&flow, 0)).unwrap() as usize % 2] += 1;
        }
        assert!(seen[0] > 8 && seen[1] > 8, "{seen:?}");
    }

    /// An IPv4 packet of `protocol` from `src` whose payload is `payload`.
    fn outer(protocol: u8, src: [u8; 4], payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; 20];
        p[0] = 0x45;
        p[9] = protocol;
        p[12..16].copy_from_slice(&src);
        p[16..20].copy_from_slice(&[10, 0, 0, 2]);
        p.extend_from_slice(payload);
        p
    }

    fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
        let mut u = Vec::new();
        u.extend_from_slice(&sport.to_be_bytes());
        u.extend_from_slice(&dport.to_be_bytes());
        u.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        u.extend_from_slice(&[0, 0]);
        u.extend_from_slice(payload);
        u
    }

    #[test]
    fn esp_reaches_its_inbound_sas_owner_whatever_its_source() {
        let program = outside_program(&[4500, 4600]).expect("builds");
        let esp = |spi: u32| [&spi.to_be_bytes()[..], &[0, 0, 0, 9], &[0xaa; 40]].concat();
        for spi in [0x1001u32, 0x1002, 0xdead_beef] {
            let want = spd_sad::inbound_owner(spi, 3);
            for src in [[10, 0, 0, 1], [198, 51, 100, 7], [10, 9, 8, 7]] {
                // Raw ESP, and ESP in UDP from any source port.
                let raw = run(&program, &outer(50, src, &esp(spi))).expect("runs");
                assert_eq!(raw as usize % 3, want, "raw ESP SPI {spi:#x} from {src:?}");
                for sport in [4500, 61_000, 1] {
                    for dport in [4500, 4600] {
                        let packet = outer(17, src, &udp(sport, dport, &esp(spi)));
                        let got = run(&program, &packet).expect("runs");
                        assert_eq!(got as usize % 3, want, "UDP {sport}->{dport} SPI {spi:#x}");
                    }
                }
            }
        }
        // With IP options the SPI is found past them.
        let mut with_options = outer(50, [10, 0, 0, 1], &[0; 4]);
        with_options[0] = 0x46;
        with_options.truncate(20);
        with_options.extend_from_slice(&[1, 1, 1, 1]);
        with_options.extend_from_slice(&esp(0x1001));
        assert_eq!(run(&program, &with_options), Some(0x1001));
        // IKE behind the marker, UDP on other ports and other protocols:
        // by the addresses, whatever their ports.
        let hash = |src: [u8; 4]| run(&program, &outer(6, src, &[0; 20])).expect("runs");
        for src in [[10, 0, 0, 1], [198, 51, 100, 7]] {
            let ike = outer(17, src, &udp(4500, 4500, &[0, 0, 0, 0, 1, 2, 3, 4]));
            assert_eq!(run(&program, &ike), Some(hash(src)));
            let other = outer(17, src, &udp(4500, 53, &esp(0x1001)));
            assert_eq!(run(&program, &other), Some(hash(src)));
        }
        assert_ne!(hash([10, 0, 0, 1]), hash([198, 51, 100, 7]));
        assert!(matches!(
            outside_program(&vec![4500; MAX_NAT_PORTS + 1]),
            Err(SteerError::TooManyPorts(_))
        ));
    }

    #[test]
    fn too_many_policies_are_refused_with_the_way_out() {
        let mut sad = Sad::new();
        let mut spd = Spd::new();
        let id = sa(&mut sad, "one", [10, 0, 0, 2]);
        for i in 0..250u32 {
            let selector = Selector {
                src: Ipv4Prefix::new(Ipv4Addr::from(0xc0a8_0000 | (i << 8)), 24)
                    .unwrap()
                    .into(),
                dst: IpPrefix::Any,
                protocol: ProtocolSelector::Number(proto::TCP),
                src_ports: PortRange { first: 1, last: 2 },
                dst_ports: PortRange { first: 3, last: 4 },
            };
            spd.insert(policy(&format!("p{i}"), selector, Action::Protect(id)));
        }
        let e = inside_program(&spd, &sad, 2).unwrap_err();
        assert!(e.to_string().contains("--workers 1"), "{e}");
    }
}
