//! kubexm-cli: what every kubexm binary shares.
//!
//! Binaries stay thin: they parse flags, call one library operation, and hand
//! any error to [`exit`], which prints it and maps its class to the exit code
//! documented in the README ("Exit codes"). The table lives here so that
//! `kubexm-bundle` and `kubexm-install` can never disagree about it.

pub mod progress;

use std::process::ExitCode;

use kubexm_bom::catalog::CatalogError;
use kubexm_bom::config::LoadError;

/// Classes of failure and their exit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A bug in kubexm.
    Internal = 1,
    /// Bad flags or arguments (clap uses 2 as well).
    Usage = 2,
    /// cluster.yaml or a catalog is invalid.
    Config = 3,
    /// A local file or directory cannot be read or written.
    Io = 4,
    /// An upstream or registry could not be reached or answered wrongly.
    Fetch = 5,
    /// A digest or signature did not match.
    Verify = 6,
    /// A host or deployment step failed.
    Host = 7,
    /// The config asks for something this release does not implement.
    Unsupported = 8,
    /// Stopped by Ctrl-C.
    Interrupted = 130,
}

/// An error already tagged with its class.
#[derive(Debug)]
pub struct Classified {
    pub class: Class,
    pub error: anyhow::Error,
}

impl std::fmt::Display for Classified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.error)
    }
}

impl std::error::Error for Classified {}

/// Tags an error with a class.
pub fn classified(class: Class, error: impl Into<anyhow::Error>) -> anyhow::Error {
    anyhow::Error::new(Classified {
        class,
        error: error.into(),
    })
}

/// The class of an error: the first cause in its chain that the binary's
/// own `kind` (its libraries' error types) or the shared table here (a tag,
/// a config or catalog error, an I/O error) knows; a bug otherwise.
pub fn class_of(err: &anyhow::Error, kind: impl Fn(&(dyn std::error::Error + 'static)) -> Option<Class>) -> Class {
    err.chain()
        .find_map(|c| kind(c).or_else(|| shared_class(c)))
        .unwrap_or(Class::Internal)
}

/// The classes every binary shares: its own tags, config and catalog errors, I/O.
fn shared_class(cause: &(dyn std::error::Error + 'static)) -> Option<Class> {
    if let Some(c) = cause.downcast_ref::<Classified>() {
        return Some(c.class);
    }
    if let Some(e) = cause.downcast_ref::<LoadError>() {
        return Some(match e {
            LoadError::Read { .. } => Class::Io,
            LoadError::TooLarge { .. } => Class::Config,
            LoadError::Invalid(d) if d.diagnostics.iter().all(|d| d.kind == kubexm_bom::diag::Kind::Unsupported) => Class::Unsupported,
            LoadError::Invalid(_) => Class::Config,
        });
    }
    if let Some(e) = cause.downcast_ref::<CatalogError>() {
        return Some(match e {
            CatalogError::Read { .. } => Class::Io,
            CatalogError::Parse { .. } => Class::Config,
        });
    }
    cause.downcast_ref::<std::io::Error>().map(|_| Class::Io)
}

pub use kubexm_bom::diag::error_chain;

/// Whether the error is a write to a reader that went away (`| head`).
fn broken_pipe(err: &anyhow::Error) -> bool {
    err.chain()
        .filter_map(|c| c.downcast_ref::<std::io::Error>())
        .any(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
}

/// A reader that closes our stdout early (`kubexm-bundle bom | head -1`)
/// ends the program quietly with success, as it asked for no more: `print!`
/// would otherwise panic.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = kubexm_engine::run::panic_message(info.payload());
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info)
    }));
}

/// Prints an error to stderr and returns its exit code, the class found by
/// [`class_of`] with the binary's own `kind`.
pub fn exit(result: anyhow::Result<()>, kind: impl Fn(&(dyn std::error::Error + 'static)) -> Option<Class>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            let class = class_of(&err, kind);
            let text = format!("{err:#}");
            // Multi-line errors (diagnostics) read better starting on their own line.
            if text.contains('\n') {
                eprintln!("error: {}", text.trim_end());
            } else {
                eprintln!("error: {text}");
            }
            if class == Class::Internal {
                eprintln!("This is a bug in kubexm; please report it with the command you ran.");
            }
            ExitCode::from(class as u8)
        }
    }
}

/// `-o` values shared by all commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Table,
    Json,
    Yaml,
}

/// Logs go to stderr; `RUST_LOG` or `-v` raise the level.
pub fn init_logging(verbose: u8) {
    quiet_on_closed_stdout();
    // kube's client logs each failed request as an error of its own; our
    // callers say what failed and what they do about it (below -vv).
    let default = match verbose {
        0 => "warn,kube_client=off",
        1 => "info,kube_client=off",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false)
        .without_time()
        .try_init();
}

/// Helpers for the binaries' tests.
pub mod testing {
    /// Runs `cmd` with its stdout closed before it writes (`cmd | true`);
    /// returns its exit code and stderr.
    pub fn run_with_closed_stdout(mut cmd: std::process::Command) -> std::io::Result<(Option<i32>, String)> {
        let mut child = cmd
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        drop(child.stdout.take());
        let out = child.wait_with_output()?;
        Ok((out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned()))
    }
}
