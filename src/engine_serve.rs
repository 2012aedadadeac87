//! `espgw engine serve`: one engine (soft, the sec model, or afalg) in its
//! own process, served to tenants over a Unix control socket (mode 0600)
//! with per-tenant shared-memory rings or the socket transport. The server
//! itself lives in `accel::shared::server`; this file parses flags, drops
//! privileges and handles signals.

use std::ffi::CString;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use accel::shared::{Server, ServerConfig};
use accel::{EngineKind, EngineSpec};
use anyhow::{bail, Context, Result};

#[derive(clap::Subcommand)]
pub enum EngineCommand {
    /// Serve one engine to many tenants (gateways with engine = "shared").
    Serve(ServeArgs),
    /// A running server's counters: tenants, requests, refusals by rule.
    Stats {
        /// The server's control socket.
        #[arg(long)]
        socket: PathBuf,
        /// Print the counters as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
pub struct ServeArgs {
    /// The control socket to listen on (created with mode 0600).
    #[arg(long)]
    socket: PathBuf,
    /// The engine behind the server: soft, sec or afalg.
    #[arg(long)]
    engine: Option<EngineKind>,
    /// Take the engine's settings (profile, channels, buffers...) from this
    /// gateway configuration's [accel] section.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Requests one tenant may have in flight.
    #[arg(long, default_value_t = 256)]
    quota: usize,
    /// Tenants served at once.
    #[arg(long, default_value_t = 64)]
    max_tenants: usize,
    /// A tenant that leaves completions unread this long is reclaimed.
    #[arg(long, default_value_t = 2000)]
    hung_ms: u64,
    /// Microseconds the back end polls idle rings before it sleeps.
    #[arg(long, default_value_t = 50)]
    spin_us: u64,
    /// After binding, run as this user (needs root; the socket is handed
    /// to the user, still mode 0600).
    #[arg(long)]
    user: Option<String>,
}

pub fn run(command: &EngineCommand) -> Result<()> {
    let args = match command {
        EngineCommand::Serve(args) => args,
        EngineCommand::Stats { socket, json } => return stats(socket, *json),
    };
    let mut spec = match &args.config {
        Some(path) => crate::load_config(path)?.engine,
        None => EngineSpec::default(),
    };
    if let Some(kind) = args.engine {
        spec.kind = kind;
    }
    if spec.kind == EngineKind::Shared {
        bail!("the server cannot serve the shared engine itself: --engine soft, sec or afalg");
    }
    if args.quota == 0 || args.max_tenants == 0 {
        bail!("--quota and --max-tenants must be at least 1");
    }
    let kind = spec.kind;
    let mut config = ServerConfig::new(args.socket.clone(), spec);
    config.quota = args.quota;
    config.max_tenants = args.max_tenants;
    config.hung_after = Duration::from_millis(args.hung_ms);
    config.spin = Duration::from_micros(args.spin_us);
    let mut server = Server::bind(config)?;
    if let Some(user) = &args.user {
        drop_privileges(user, &args.socket)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop)).context("installing the signal handler")?;
    }
    eprintln!(
        "espgw engine serve: the {kind} engine on {} (mode 0600), quota {} per tenant, at most {} tenants",
        args.socket.display(),
        args.quota,
        args.max_tenants
    );
    server.run(&stop)?;
    let s = server.stats();
    eprintln!(
        "espgw engine serve: stopped; {} tenants attached, {} reclaimed, {} requests executed, {} refused \
         (foreign session {}, stale handle {}, bad region {}, malformed {}), {} sessions wiped",
        s.attached,
        s.reclaimed,
        s.executed,
        s.refused(),
        s.foreign_session,
        s.stale_session,
        s.bad_region,
        s.malformed,
        s.sessions_wiped
    );
    Ok(())
}

/// Becomes `user` (groups, gid, uid), after handing it the socket.
fn drop_privileges(user: &str, socket: &std::path::Path) -> Result<()> {
    let name = CString::new(user).context("--user")?;
    // SAFETY: getpwnam returns a pointer into static storage or null; it is
    // read at once, before any other call could overwrite it.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        bail!("--user {user}: no such user");
    }
    // SAFETY: non-null, points at a passwd record (see above).
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    let path = CString::new(socket.as_os_str().as_encoded_bytes()).context("--socket")?;
    // SAFETY: plain system calls with valid arguments; each result is checked.
    unsafe {
        if libc::chown(path.as_ptr(), uid, gid) != 0
            || libc::setgroups(0, std::ptr::null()) != 0
            || libc::setgid(gid) != 0
            || libc::setuid(uid) != 0
        {
            bail!(
                "--user {user}: cannot become that user ({}); run as root or leave --user out",
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(())
}

fn stats(socket: &std::path::Path, json: bool) -> Result<()> {
    let s = accel::shared::query_stats(socket)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    println!(
        "tenants          {} attached now, {} since start, {} reclaimed",
        s.tenants, s.attached, s.reclaimed
    );
    println!(
        "requests         {} executed, {} discarded (their tenant was gone)",
        s.executed, s.discarded
    );
    println!(
        "refused          {} (foreign session {}, stale handle {}, bad region {}, malformed {})",
        s.refused(),
        s.foreign_session,
        s.stale_session,
        s.bad_region,
        s.malformed
    );
    println!("quota full       {}", s.quota_full);
    println!("sessions wiped   {}", s.sessions_wiped);
    Ok(())
}
