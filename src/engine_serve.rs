//! `espgw engine serve`: one engine (soft, the sec model, or afalg) in its
//! own process, served to tenants over a Unix control socket (mode 0600,
//! or 0660 with a group) with per-tenant shared-memory rings or the socket
//! transport. The server itself lives in `accel::shared::server`; this
//! file parses flags, drops privileges, keeps the process out of core
//! dumps, handles signals and, with `--metrics`, serves the server's
//! counters for Prometheus (`crate::metrics::render_engine_server`).

use std::ffi::CString;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use accel::shared::{Access, FdLimits, Server, ServerConfig};
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
    /// The control socket to listen on (created with mode 0600, or 0660
    /// with --user or --group).
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
    /// A connection that has not attached within this many milliseconds
    /// is closed (at most 16 wait at once; the oldest makes room).
    #[arg(long, default_value_t = 1000)]
    attach_ms: u64,
    /// File descriptors one tenant's sessions may hold in the engine
    /// (afalg: two per transform; default: a quarter of what the
    /// descriptor limit leaves for sessions).
    #[arg(long)]
    fds_per_tenant: Option<usize>,
    /// After binding, run as this user (needs root). The socket is created
    /// with mode 0660 and the user's group (or --group's), never chowned
    /// by path afterwards; peers of this user (and root) are admitted.
    #[arg(long)]
    user: Option<String>,
    /// Also admit the members of this group (primary or supplementary, by
    /// the kernel's record of the peer); the socket gets this group, 0660.
    #[arg(long)]
    group: Option<String>,
    /// Serve the server's counters (tenants, requests by outcome,
    /// refusals by rule, the back end's time) for Prometheus at
    /// http://ADDR:PORT/metrics (bound before privileges are dropped).
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<String>,
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
    if args.max_tenants > 32_768 {
        bail!("--max-tenants is at most 32768");
    }
    let user = args.user.as_deref().map(lookup_user).transpose()?;
    let group = args.group.as_deref().map(lookup_group).transpose()?;
    // More descriptors for sessions where the hard limit allows (the
    // afalg engine holds sockets per session; the budget follows the limit).
    raise_descriptor_limit();
    let kind = spec.kind;
    let mut config = ServerConfig::new(args.socket.clone(), spec);
    config.quota = args.quota;
    config.max_tenants = args.max_tenants;
    config.hung_after = Duration::from_millis(args.hung_ms);
    config.spin = Duration::from_micros(args.spin_us);
    config.attach_within = Duration::from_millis(args.attach_ms);
    config.fds = FdLimits {
        per_tenant: args.fds_per_tenant,
        total: None,
    };
    config.access = Access {
        user: user.as_ref().map(|u| u.uid),
        group,
        socket_group: group.or(user.as_ref().map(|u| u.gid)),
    };
    let mut server = Server::bind(config)?;
    let metrics = args
        .metrics
        .as_deref()
        .map(crate::metrics::MetricsServer::bind)
        .transpose()?;
    if let Some(user) = &user {
        drop_privileges(user)?;
    }
    if let Some(metrics) = metrics {
        let address = metrics.local_addr();
        let published = server.published();
        metrics.serve(move || {
            crate::metrics::render_engine_server(
                &published.stats(),
                published.busy_ns(),
                published.cpu_ns(),
                published.control_ns(),
            )
        })?;
        if let Some(address) = address {
            eprintln!("espgw engine serve: Prometheus metrics at http://{address}/metrics");
        }
    }
    keep_out_of_core_dumps()?;
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop)).context("installing the signal handler")?;
    }
    let budget = server.budget();
    let fds = match kind {
        EngineKind::Afalg => format!(
            ", sessions' descriptors {} per tenant and {} in all",
            budget.per_tenant, budget.total
        ),
        _ => String::new(),
    };
    eprintln!(
        "espgw engine serve: the {kind} engine on {} (mode {}), quota {} per tenant, at most {} tenants{fds}",
        args.socket.display(),
        if args.user.is_some() || args.group.is_some() {
            "0660"
        } else {
            "0600"
        },
        args.quota,
        args.max_tenants,
    );
    server.run(&stop)?;
    let s = server.stats();
    eprintln!(
        "espgw engine serve: stopped; {} tenants attached, {} reclaimed ({} evicted), {} requests executed, \
         {} refused (foreign session {}, stale handle {}, bad region {}, malformed {}), {} sessions wiped, \
         {} idle connections closed, {} peers refused, {} registrations over budget",
        s.attached,
        s.reclaimed,
        s.evicted,
        s.executed,
        s.refused(),
        s.foreign_session,
        s.stale_session,
        s.bad_region,
        s.malformed,
        s.sessions_wiped,
        s.idle_closed,
        s.refused_peers,
        s.over_budget
    );
    Ok(())
}

struct User {
    name: String,
    uid: u32,
    gid: u32,
}

fn lookup_user(user: &str) -> Result<User> {
    let name = CString::new(user).context("--user")?;
    // SAFETY: getpwnam returns a pointer into static storage or null; it is
    // read at once, before any other call could overwrite it (the process
    // has one thread here).
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        bail!("--user {user}: no such user");
    }
    // SAFETY: non-null, points at a passwd record (see above).
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    Ok(User {
        name: user.to_owned(),
        uid,
        gid,
    })
}

fn lookup_group(group: &str) -> Result<u32> {
    let name = CString::new(group).context("--group")?;
    // SAFETY: as for getpwnam in `lookup_user`.
    let gr = unsafe { libc::getgrnam(name.as_ptr()) };
    if gr.is_null() {
        bail!("--group {group}: no such group");
    }
    // SAFETY: non-null, points at a group record.
    Ok(unsafe { (*gr).gr_gid })
}

fn raise_descriptor_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a struct we own; a refusal leaves
    // the limit as it was.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// The server holds every tenant's keys: no core file may carry them.
/// Not dumpable (also keeps other processes of its user from reading its
/// memory through /proc or ptrace), and a core limit of zero. Done after
/// any change of user, which resets the dumpable flag.
fn keep_out_of_core_dumps() -> Result<()> {
    let none = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prctl and setrlimit with plain arguments.
    unsafe {
        if libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0
            || libc::setrlimit(libc::RLIMIT_CORE, &none) != 0
        {
            bail!(
                "cannot keep the engine server out of core dumps: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(())
}

/// Becomes `user` (no supplementary groups, its group, its user ID). The
/// socket was created with its final group and mode (see `Access`), and
/// the server keeps its descriptor: nothing is changed by path.
fn drop_privileges(user: &User) -> Result<()> {
    // SAFETY: plain system calls with valid arguments; each result is checked.
    let dropped = unsafe {
        libc::setgroups(0, std::ptr::null()) == 0
            && libc::setgid(user.gid) == 0
            && libc::setuid(user.uid) == 0
    };
    if !dropped {
        bail!(
            "--user {}: cannot become that user ({}); run as root or leave --user out",
            user.name,
            std::io::Error::last_os_error()
        );
    }
    // A user that can become root again has not dropped anything.
    // SAFETY: as above.
    if user.uid != 0 && unsafe { libc::setuid(0) } == 0 {
        bail!(
            "--user {}: root privileges could be regained after the switch",
            user.name
        );
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
    println!(
        "hostile          {} evicted, {} idle connections closed, {} peers refused, {} over budget",
        s.evicted, s.idle_closed, s.refused_peers, s.over_budget
    );
    Ok(())
}
