//! Why an SA leaves the gateways: the `reason` (and the `tunnel`) of its
//! `sa_removed` line. The keying sources (the control plane, the `xfrm`
//! mirror) know why when they issue the removal, and say so beside the
//! command (`Issued`); the driver that applies the command logs it.
//!
//! Owns the reasons and the queue of issued commands with their notes;
//! must not apply or log anything.

use dataplane::command::SaCommand;

/// Why an SA was removed (its keyword is the log's `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::Display)]
#[strum(serialize_all = "snake_case")]
pub enum Removal {
    /// Replaced by a rekey, at the end of its grace period.
    Rekeyed,
    /// A replaced SA kept for a peer that never confirmed the switch
    /// reached its hard lifetime.
    ExpiredHard,
    /// A reload removed or changed its tunnel or `[[sa]]`.
    Reload,
    /// Made by an exchange that was never confirmed (an INIT or rekey
    /// answered, expired or overtaken by a newer one).
    Unconfirmed,
    /// One replaced SA too many kept for a peer that never confirmed its
    /// switches: the oldest goes.
    KeptTooMany,
    /// Gone from the keying namespace's kernel (deleted, expired or
    /// flushed there).
    XfrmDeleted,
    /// Gone from the keying namespace's kernel once a rekey had installed
    /// its successor.
    XfrmRekeyed,
    /// Its SPI came back with other keys in the keying namespace: a new SA
    /// takes its place.
    XfrmReplaced,
    /// An inbound SA that no policy of the keying namespace names any more.
    XfrmUnselected,
}

impl Removal {
    /// The keyword, as the log writes it.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// What the source of an SA removal says of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovalNote {
    /// Why.
    pub why: Removal,
    /// The tunnel the SA belonged to, when the source knows it (a tunnel a
    /// reload removed is no longer in the configuration the driver holds).
    pub tunnel: Option<String>,
}

/// Commands in the order issued, each SA removal with its note.
#[derive(Debug, Default)]
pub(crate) struct Issued {
    commands: Vec<(SaCommand, Option<RemovalNote>)>,
}

impl Issued {
    pub(crate) fn push(&mut self, command: SaCommand) {
        self.commands.push((command, None));
    }

    /// Issues the removal of SA `name`, for `why`.
    pub(crate) fn remove_sa(&mut self, name: String, why: Removal, tunnel: Option<&str>) {
        self.commands.push((
            SaCommand::RemoveSa(name),
            Some(RemovalNote {
                why,
                tunnel: tunnel.map(str::to_owned),
            }),
        ));
    }

    /// Moves the commands to `into`, without their notes.
    pub(crate) fn take(&mut self, into: &mut Vec<SaCommand>) {
        into.extend(self.commands.drain(..).map(|(command, _)| command));
    }

    /// Moves the commands to `into`, with their notes.
    pub(crate) fn take_noted(&mut self, into: &mut Vec<(SaCommand, Option<RemovalNote>)>) {
        into.append(&mut self.commands);
    }
}
