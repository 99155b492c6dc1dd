//! The `aigw` command: parses the command line and hands over to the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// mimalloc: the request path allocates many small, short-lived buffers; glibc's malloc cost
/// about 15 % of the gateway's CPU under load (bench/run.py with perf). The feature
/// `system-allocator` leaves glibc's in place, for heap profilers that hook it (heaptrack).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: Mimalloc = Mimalloc;

/// mimalloc as the global allocator, asking for an alignment only where its plain `mi_malloc`
/// would not give it: the `mimalloc` crate's `MiMalloc` calls `mi_malloc_aligned` for every
/// allocation, whose checks cost about 2,700 instructions a request more (`python3
/// bench/run.py --instructions`, 50-odd allocations a request). The rule is the standard
/// library's own for its system allocator: an alignment of at most 16 bytes and at most the
/// size is what `mi_malloc` guarantees (mimalloc aligns a block of 16 bytes or more to 16, a
/// smaller one to its size class).
#[cfg(not(feature = "system-allocator"))]
struct Mimalloc;

#[cfg(not(feature = "system-allocator"))]
// SAFETY: every block comes from mimalloc with at least the layout's alignment (see above), and
// is freed or grown by mimalloc.
unsafe impl std::alloc::GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        use libmimalloc_sys::{mi_malloc, mi_malloc_aligned};
        if plain(layout.align(), layout.size()) {
            unsafe { mi_malloc(layout.size()).cast() }
        } else {
            unsafe { mi_malloc_aligned(layout.size(), layout.align()).cast() }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        use libmimalloc_sys::{mi_zalloc, mi_zalloc_aligned};
        if plain(layout.align(), layout.size()) {
            unsafe { mi_zalloc(layout.size()).cast() }
        } else {
            unsafe { mi_zalloc_aligned(layout.size(), layout.align()).cast() }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: std::alloc::Layout) {
        unsafe { libmimalloc_sys::mi_free(ptr.cast()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        use libmimalloc_sys::{mi_realloc, mi_realloc_aligned};
        if plain(layout.align(), new_size) {
            unsafe { mi_realloc(ptr.cast(), new_size).cast() }
        } else {
            unsafe { mi_realloc_aligned(ptr.cast(), new_size, layout.align()).cast() }
        }
    }
}

/// Whether `mi_malloc(size)` is aligned to `align` (the rule of std's `System` on x86-64 and
/// aarch64, whose `malloc` gives 16 bytes as mimalloc does).
#[cfg(not(feature = "system-allocator"))]
#[inline]
fn plain(align: usize, size: usize) -> bool {
    align <= 16 && align <= size
}

#[derive(Parser)]
#[command(
    name = "aigw",
    version,
    about = "An OpenAI-compatible LLM API gateway for companies"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve {
        /// Settings file (TOML); `AIGW_*` variables override it.
        #[arg(long, env = "AIGW_CONFIG")]
        config: Option<PathBuf>,
        /// Resources file applied at start (workspaces, members, keys, upstreams, models, policies).
        #[arg(long, env = "AIGW_RESOURCES")]
        resources: Option<PathBuf>,
    },
    /// Check the settings and a resources file without starting.
    ///
    /// As `serve` would check them, without writing anything: every problem is listed; the exit
    /// status is 0 when `serve` would start, else 1.
    Check {
        /// Settings file (TOML); `AIGW_*` variables override it.
        #[arg(long, env = "AIGW_CONFIG")]
        config: Option<PathBuf>,
        /// Resources file, checked against the configured database when it exists.
        #[arg(long, env = "AIGW_RESOURCES")]
        resources: Option<PathBuf>,
    },
    /// Administer the gateway from its host, against the configured database.
    #[command(subcommand)]
    Admin(Admin),
    /// Run the scriptable mock upstream (OpenAI and Anthropic shapes) for demos and benchmarks.
    MockUpstream {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:18080")]
        listen: std::net::SocketAddr,
        /// Only count calls instead of keeping them for `/__mock/calls` (benchmarks).
        #[arg(long)]
        no_record: bool,
        /// Also listen here over TLS, offering HTTP/2 (needs `--tls-cert` and `--tls-key`).
        #[arg(long, requires_all = ["tls_cert", "tls_key"])]
        tls_listen: Option<std::net::SocketAddr>,
        /// The TLS listener's certificate chain (PEM).
        #[arg(long, requires = "tls_listen")]
        tls_cert: Option<PathBuf>,
        /// The TLS listener's private key (PEM).
        #[arg(long, requires = "tls_listen")]
        tls_key: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum Admin {
    /// Set a member's password (a lost owner password, say).
    ///
    /// The new password is read from the first line of standard input, or asked for on the
    /// terminal; never give it on the command line. The member's sessions end; the audit log
    /// records the reset.
    ResetPassword {
        /// The member's email.
        email: String,
        /// Generate a password and print it once instead of reading one.
        #[arg(long)]
        generate: bool,
        /// Settings file (TOML) of the gateway; `AIGW_*` variables override it.
        #[arg(long, env = "AIGW_CONFIG")]
        config: Option<PathBuf>,
    },
}

/// `serve --help` lists every setting after the flags.
fn settings_help() -> String {
    let mut help = String::from(
        "Settings: each is a key of the --config file or its AIGW_* variable (the variable wins); \
         defaults and details in README.md, \"Configuration\". `aigw check` checks them without \
         starting.\n\n",
    );
    for s in aigw::config::SETTINGS {
        let doc = s.doc.split_whitespace().collect::<Vec<_>>().join(" ");
        let first = doc.split_inclusive(". ").next().unwrap_or(&doc).trim_end();
        help.push_str(&format!("  {:<36} {}\n      {first}\n", s.key, s.env));
    }
    help
}

fn main() -> ExitCode {
    no_huge_pages();
    // SAFETY: no other thread exists yet, so none uses SQLite.
    unsafe { aigw::store::sqlite_on_mimalloc() };
    let command = Cli::command().mut_subcommand("serve", |c| {
        c.after_long_help(settings_help())
            .after_help("The settings (AIGW_* variables or --config keys) are listed by `aigw serve --help`.")
    });
    let cli = match Cli::from_arg_matches(&command.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("aigw: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result: Result<(), String> = runtime.block_on(async {
        match cli.command {
            Command::Serve { config, resources } => serve(config, resources).await,
            Command::Check { config, resources } => check(config, resources).await,
            Command::Admin(Admin::ResetPassword {
                email,
                generate,
                config,
            }) => reset_password(config, &email, generate).await,
            Command::MockUpstream {
                listen,
                no_record,
                tls_listen,
                tls_cert,
                tls_key,
            } => {
                let tls = tls_listen.zip(tls_cert.zip(tls_key));
                mock_upstream(listen, !no_record, tls).await
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("aigw: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Turns transparent huge pages off for this process, unless `MIMALLOC_ALLOW_THP=1` asks for
/// them: mimalloc advises them for its arenas, and a 2 MiB page is resident whole once any byte
/// of it is used, so memory freed among long-lived entries (cached keys, counters) stays
/// resident. bench/scale.py measured 33 MiB less resident memory after the 100,000-key load
/// without them, 21 MiB less with 10 keys (measured with
/// `python3 bench/scale.py`; docs/performance.md, "How to tune"). The flag applies to every mapping of the process, the allocator's arenas
/// made before `main` included, from their next page fault.
fn no_huge_pages() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none_or(|v| v != "1") {
        // SAFETY: PR_SET_THP_DISABLE takes integers only and sets a flag of this process.
        unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    }
}

async fn serve(config: Option<PathBuf>, resources: Option<PathBuf>) -> Result<(), String> {
    let settings =
        aigw::Settings::load(config.as_deref(), |k| std::env::var(k).ok()).map_err(|e| e.to_string())?;
    aigw::observability::telemetry::init_logs(settings.log_format);
    let unknown =
        aigw::config::unknown_variables(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()));
    if !unknown.is_empty() {
        let named: Vec<String> = unknown
            .iter()
            .map(|name| match aigw::config::nearest_variable(name) {
                Some(near) => format!("{name} (did you mean {near}?)"),
                None => name.clone(),
            })
            .collect();
        tracing::warn!(
            variables = %named.join(", "),
            "ignoring unknown AIGW_* environment variables (a typo of a setting? `aigw serve --help` lists them)"
        );
    }
    let options = aigw::BuildOptions {
        resources,
        ..aigw::BuildOptions::default()
    };
    let mut stop = Box::pin(shutdown_signal());
    // A stop during the start ends it there, as the signal's default action did before the
    // handlers were installed; nothing is served yet, so nothing needs draining.
    let gateway = tokio::select! {
        built = aigw::Gateway::build(settings, options) => built.map_err(|e| e.to_string())?,
        () = &mut stop => return Ok(()),
    };
    // The start may have parsed a resources file of megabytes; what it freed goes back to the
    // system now instead of staying in the allocator's pages for the gateway's life.
    // SAFETY: mi_collect takes no pointers; it only releases the allocator's free memory.
    unsafe { libmimalloc_sys::mi_collect(true) };
    tracing::info!(addr = %gateway.local_addr(), "aigw listening");
    if let Some(addr) = gateway.admin_addr() {
        tracing::info!(%addr, "admin API, console and metrics listening (not on the main address)");
    }
    let console = gateway.admin_addr().unwrap_or(gateway.local_addr());
    println!("aigw: console at {}", console_url(console));
    gateway
        .run_until_stopped(stop)
        .await
        .map_err(|e| format!("server error: {e}"))
}

/// The console's address as a browser on this machine reaches it.
fn console_url(addr: std::net::SocketAddr) -> String {
    let host = match addr.ip() {
        ip if ip.is_unspecified() => "localhost".to_owned(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        std::net::IpAddr::V4(ip) => ip.to_string(),
    };
    format!("http://{host}:{}/console/", addr.port())
}

/// `aigw check`: prints the notes and problems; an error (exit 1) when there is a problem.
async fn check(config: Option<PathBuf>, resources: Option<PathBuf>) -> Result<(), String> {
    let variables = std::env::vars_os().filter_map(|(k, _)| k.into_string().ok());
    let report = aigw::operator::check::check(
        config.as_deref(),
        resources.as_deref(),
        &|k| std::env::var(k).ok(),
        variables,
    )
    .await;
    for note in &report.notes {
        eprintln!("aigw check: note: {note}");
    }
    for problem in &report.problems {
        eprintln!("{problem}");
    }
    match report.problems.len() {
        0 => {
            println!(
                "aigw check: the settings{} are valid",
                if resources.is_some() {
                    " and the resources file"
                } else {
                    ""
                }
            );
            Ok(())
        }
        1 => Err("check: 1 problem".to_owned()),
        n => Err(format!("check: {n} problems")),
    }
}

/// `aigw admin reset-password EMAIL`.
async fn reset_password(config: Option<PathBuf>, email: &str, generate: bool) -> Result<(), String> {
    use aigw::operator::reset_password::{NewPassword, read_hidden_line};
    let settings =
        aigw::Settings::load(config.as_deref(), |k| std::env::var(k).ok()).map_err(|e| e.to_string())?;
    let new = if generate {
        NewPassword::Generate
    } else {
        match read_hidden_line(&format!("New password for {email} (Enter alone generates one): ")) {
            Some(first) => {
                let first = first.map_err(|e| format!("cannot read the password: {e}"))?;
                if first.is_empty() {
                    NewPassword::Generate
                } else {
                    let again = read_hidden_line("Again: ")
                        .unwrap_or(Ok(String::new()))
                        .map_err(|e| format!("cannot read the password: {e}"))?;
                    if again != first {
                        return Err("the two passwords differ; nothing was changed".to_owned());
                    }
                    NewPassword::Given(first)
                }
            }
            None => {
                let mut line = String::new();
                std::io::stdin()
                    .read_line(&mut line)
                    .map_err(|e| format!("cannot read the password from standard input: {e}"))?;
                let line = line.trim_end_matches(['\n', '\r']);
                if line.is_empty() {
                    return Err(
                        "no password on standard input (give one on its first line, or use --generate)"
                            .to_owned(),
                    );
                }
                NewPassword::Given(line.to_owned())
            }
        }
    };
    let now = aigw::Clock::System.now_ms();
    let generated = aigw::operator::reset_password::reset_password(&settings, email, new, now).await?;
    match generated {
        Some(password) => println!("aigw: new password for {email}: {password}"),
        None => println!("aigw: the password of {email} is set"),
    }
    println!("aigw: {email}'s sessions have ended; the audit log records the reset");
    Ok(())
}

async fn mock_upstream(
    listen: std::net::SocketAddr,
    keep_calls: bool,
    tls: Option<(std::net::SocketAddr, (PathBuf, PathBuf))>,
) -> Result<(), String> {
    let stop = shutdown_signal();
    let mock = aigw::mock_upstream::MockUpstream::start_with(listen, keep_calls)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    println!(
        "aigw mock upstream on {} (base_url {})",
        mock.addr(),
        mock.base_url()
    );
    if let Some((addr, (cert, key))) = tls {
        let addr = mock
            .serve_tls(addr, &cert, &key)
            .await
            .map_err(|e| format!("cannot serve TLS on {addr}: {e}"))?;
        println!(
            "aigw mock upstream over TLS on {addr} (base_url https://localhost:{}/v1)",
            addr.port()
        );
    }
    stop.await;
    mock.stop();
    Ok(())
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is called, not when the
/// future is first polled: a signal that arrives while the gateway starts is not lost to the
/// default action (which would end the process without draining).
fn shutdown_signal() -> impl Future<Output = ()> {
    #[cfg(unix)]
    let (mut int, mut term) = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::interrupt()).ok(),
            signal(SignalKind::terminate()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        {
            tokio::select! {
                () = received(int.as_mut()) => {},
                () = received(term.as_mut()) => {},
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        tracing::info!("shutdown signal received; finishing running requests");
    }
}

/// Resolves when `signal` is received (never without a handler).
#[cfg(unix)]
async fn received(signal: Option<&mut tokio::signal::unix::Signal>) {
    match signal {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending::<()>().await,
    }
}

#[cfg(all(test, not(feature = "system-allocator")))]
mod tests {
    use std::alloc::{GlobalAlloc, Layout};

    use super::{Mimalloc, plain};

    /// The premise of the plain path: whatever layout it serves, `mi_malloc`, `mi_zalloc` and
    /// `mi_realloc` hand back a block aligned as asked (every size to 4 KiB, every alignment
    /// the rule lets through), and zeroed where asked.
    #[test]
    fn the_plain_path_gives_the_alignment_asked() {
        let mut served = 0;
        for size in 1..=4096 {
            for align in [1, 2, 4, 8, 16] {
                if !plain(align, size) {
                    continue;
                }
                served += 1;
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: a non-zero size; each block is freed with the allocator it came from.
                unsafe {
                    let p = Mimalloc.alloc(layout);
                    assert!(!p.is_null() && p.align_offset(align) == 0, "alloc {size}/{align}");
                    let p = Mimalloc.realloc(p, layout, size * 2);
                    assert!(
                        !p.is_null() && p.align_offset(align) == 0,
                        "realloc {size}/{align}"
                    );
                    Mimalloc.dealloc(p, Layout::from_size_align(size * 2, align).unwrap());
                    let z = Mimalloc.alloc_zeroed(layout);
                    assert!(
                        !z.is_null() && z.align_offset(align) == 0,
                        "zeroed {size}/{align}"
                    );
                    assert!(std::slice::from_raw_parts(z, size).iter().all(|&b| b == 0));
                    Mimalloc.dealloc(z, layout);
                }
            }
        }
        assert!(
            served > 4096 * 4,
            "the plain path serves nearly every small layout"
        );
        // The rest take the aligned calls: an alignment above 16, or above the size.
        assert!(!plain(32, 64) && !plain(8, 4) && plain(16, 16) && plain(8, 8));
    }
}
