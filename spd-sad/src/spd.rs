//! The Security Policy Database (RFC 4301 §4.4.1): ordered policies per
//! direction, first match wins, discard when nothing matches.

use std::fmt;

use crate::sad::SaId;
use crate::selector::{FlowKey, Selector};

/// Which traffic a policy governs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyDirection {
    /// Traffic leaving through the protected (outside) interface.
    Out,
    /// Traffic arriving from the outside interface.
    In,
}

impl fmt::Display for PolicyDirection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PolicyDirection::Out => "out",
            PolicyDirection::In => "in",
        })
    }
}

/// What happens to traffic a policy matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Outbound: encapsulate with this SA. Inbound: the traffic must have
    /// arrived through this SA; plaintext matching it is dropped.
    Protect(SaId),
    /// Forward in the clear.
    Bypass,
    Discard,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub name: String,
    pub direction: PolicyDirection,
    /// Lower values are consulted first; equal values keep insertion order.
    pub priority: u32,
    pub selector: Selector,
    pub action: Action,
}

/// The result of an SPD lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub action: Action,
    /// Index of the matching policy in its direction's ordered list, or
    /// `None` for the default discard.
    pub policy: Option<usize>,
}

/// Ordered policies for both directions.
#[derive(Debug, Clone, Default)]
pub struct Spd {
    out: Vec<Policy>,
    inbound: Vec<Policy>,
}

impl Spd {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a policy, keeping each direction sorted by priority (stable).
    pub fn insert(&mut self, policy: Policy) {
        let list = self.list_mut(policy.direction);
        let at = list.partition_point(|p| p.priority <= policy.priority);
        list.insert(at, policy);
    }

    /// Removes every policy whose action protects with `sa`.
    pub fn remove_for_sa(&mut self, sa: SaId) {
        for list in [&mut self.out, &mut self.inbound] {
            list.retain(|p| p.action != Action::Protect(sa));
        }
    }

    /// Removes the policy called `name`; returns it if there was one.
    pub fn remove(&mut self, name: &str) -> Option<Policy> {
        for list in [&mut self.out, &mut self.inbound] {
            if let Some(at) = list.iter().position(|p| p.name == name) {
                return Some(list.remove(at));
            }
        }
        None
    }

    /// Points the policy called `name` at a new action (a rekeyed SA);
    /// false if there is no such policy.
    pub fn set_action(&mut self, name: &str, action: Action) -> bool {
        match self
            .out
            .iter_mut()
            .chain(self.inbound.iter_mut())
            .find(|p| p.name == name)
        {
            Some(policy) => {
                policy.action = action;
                true
            }
            None => false,
        }
    }

    /// The policy called `name`.
    pub fn get(&self, name: &str) -> Option<&Policy> {
        self.out
            .iter()
            .chain(self.inbound.iter())
            .find(|p| p.name == name)
    }

    fn list_mut(&mut self, direction: PolicyDirection) -> &mut Vec<Policy> {
        match direction {
            PolicyDirection::Out => &mut self.out,
            PolicyDirection::In => &mut self.inbound,
        }
    }

    /// The policies of a direction in the order they are consulted.
    pub fn policies(&self, direction: PolicyDirection) -> &[Policy] {
        match direction {
            PolicyDirection::Out => &self.out,
            PolicyDirection::In => &self.inbound,
        }
    }

    /// First matching policy; discard when none matches (RFC 4301 §4.4.1).
    pub fn lookup(&self, direction: PolicyDirection, flow: &FlowKey) -> Decision {
        self.policies(direction)
            .iter()
            .position(|p| p.selector.matches(flow))
            .map(|i| Decision {
                action: self.policies(direction)[i].action,
                policy: Some(i),
            })
            .unwrap_or(Decision {
                action: Action::Discard,
                policy: None,
            })
    }

    pub fn len(&self) -> usize {
        self.out.len() + self.inbound.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::selector::{PortRange, ProtocolSelector};

    fn policy(name: &str, priority: u32, src: &str, dst: &str, action: Action) -> Policy {
        Policy {
            name: name.into(),
            direction: PolicyDirection::Out,
            priority,
            selector: Selector {
                src: src.parse().unwrap(),
                dst: dst.parse().unwrap(),
                protocol: ProtocolSelector::Any,
                src_ports: PortRange::ANY,
                dst_ports: PortRange::ANY,
            },
            action,
        }
    }

    fn flow(src: &str, dst: &str) -> FlowKey {
        FlowKey {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            protocol: 17,
            ports: Some((1, 2)),
        }
    }

    #[test]
    fn priority_orders_lookup_and_default_is_discard() {
        let mut spd = Spd::new();
        spd.insert(policy("wide", 200, "10.0.0.0/8", "any", Action::Protect(SaId(0))));
        spd.insert(policy("narrow", 100, "10.1.0.0/16", "any", Action::Bypass));
        spd.insert(policy("also-200", 200, "any", "any", Action::Discard));
        let names: Vec<_> = spd
            .policies(PolicyDirection::Out)
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(names, ["narrow", "wide", "also-200"]);
        assert_eq!(
            spd.lookup(PolicyDirection::Out, &flow("10.1.2.3", "1.1.1.1"))
                .action,
            Action::Bypass
        );
        assert_eq!(
            spd.lookup(PolicyDirection::Out, &flow("10.9.2.3", "1.1.1.1"))
                .action,
            Action::Protect(SaId(0))
        );
        let none = spd.lookup(PolicyDirection::In, &flow("10.9.2.3", "1.1.1.1"));
        assert_eq!(none.action, Action::Discard);
        assert_eq!(none.policy, None);
        spd.remove_for_sa(SaId(0));
        assert_eq!(
            spd.lookup(PolicyDirection::Out, &flow("10.9.2.3", "1.1.1.1"))
                .action,
            Action::Discard
        );
    }

    #[test]
    fn policies_are_repointed_and_removed_by_name() {
        let mut spd = Spd::new();
        spd.insert(policy(
            "t-out",
            100,
            "10.0.0.0/8",
            "any",
            Action::Protect(SaId(0)),
        ));
        spd.insert(policy("other", 200, "any", "any", Action::Bypass));
        assert!(spd.set_action("t-out", Action::Protect(SaId(7))));
        assert!(!spd.set_action("missing", Action::Discard));
        assert_eq!(
            spd.lookup(PolicyDirection::Out, &flow("10.9.2.3", "1.1.1.1"))
                .action,
            Action::Protect(SaId(7))
        );
        assert_eq!(spd.get("t-out").map(|p| p.priority), Some(100));
        assert_eq!(spd.remove("t-out").map(|p| p.name), Some("t-out".to_owned()));
        assert!(spd.remove("t-out").is_none());
        assert_eq!(
            spd.lookup(PolicyDirection::Out, &flow("10.9.2.3", "1.1.1.1"))
                .action,
            Action::Bypass
        );
    }
}
