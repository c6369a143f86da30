//! What `kubexm-install` prints of an operation's report: text for people,
//! JSON (`-o json`) for tools.

use std::time::Instant;

use kubexm_cli::{Class, Output, classified};
use kubexm_installer::{ops, serve};

/// What `facts` gathered, as printed.
struct Gathered {
    job: i64,
    facts: Vec<kubexm_installer::engine::facts::HostFacts>,
    errors: Vec<String>,
}

/// `value` as JSON (`-o json`) or as text (its `Display`).
pub fn print<T: serde::Serialize + std::fmt::Display>(value: &T, output: Output) -> anyhow::Result<()> {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(value)?),
        _ => print!("{value}"),
    }
    Ok(())
}

/// One path a line (the files `hosts-toml` wrote).
pub fn print_paths(files: Vec<std::path::PathBuf>) -> anyhow::Result<()> {
    for f in files {
        println!("{}", f.display());
    }
    Ok(())
}

/// What `serve` prints once it listens.
pub fn print_serving(s: &serve::Served, ca: Option<&std::path::Path>, plain_http: bool, listen: std::net::SocketAddr, start: Instant) {
    let scheme = if plain_http { "http" } else { "https" };
    println!(
        "serving on {scheme}://{listen}: {} repositories, ready in {} ms",
        s.repositories().len(),
        start.elapsed().as_millis()
    );
    if let Some(ca) = ca {
        println!("nodes must trust the CA {}", ca.display());
    }
}

/// `facts`: the plan, or each host's facts (a table or JSON); the hosts that
/// failed as the error.
pub fn print_facts(report: ops::facts::FactsReport, output: Output) -> anyhow::Result<()> {
    let r = match report {
        ops::facts::FactsReport::Plan(plan) => {
            print!("{plan}");
            return Ok(());
        }
        ops::facts::FactsReport::Gathered { job, facts, errors } => Gathered { job, facts, errors },
    };
    match output {
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({"job": r.job, "facts": r.facts, "errors": r.errors}))?
        ),
        _ => {
            println!(
                "{:<12} {:<16} {:<10} {:<6} {:<18} {:>4} {:>7} {:>7}  LEFTOVERS",
                "HOST", "HOSTNAME", "OS", "ARCH", "KERNEL", "CPUS", "MEM MB", "CLOCK"
            );
            for f in &r.facts {
                println!(
                    "{:<12} {:<16} {:<10} {:<6} {:<18} {:>4} {:>7} {:>5}ms  {}",
                    f.host,
                    f.hostname,
                    format!("{} {}", f.os_id, f.os_version),
                    f.arch,
                    f.kernel,
                    f.cpus,
                    f.memory_mb,
                    f.clock_offset_ms,
                    if f.leftovers.is_empty() {
                        "-".to_string()
                    } else {
                        f.leftovers.join(" ")
                    }
                );
            }
        }
    }
    if !r.errors.is_empty() {
        return Err(classified(
            Class::Host,
            anyhow::anyhow!("{} host(s) failed (job {}):\n  {}", r.errors.len(), r.job, r.errors.join("\n  ")),
        ));
    }
    Ok(())
}

/// What `unpack` did, as text or JSON.
pub fn print_unpacked(bundle: &std::path::Path, u: &kubexm_installer::unpack::Unpacked, output: Output) -> anyhow::Result<()> {
    match output {
        Output::Json => println!(
            "{}",
            serde_json::json!({"dir": u.dir, "fresh": u.fresh, "members": u.manifest.members.len() + 1})
        ),
        _ if u.fresh => {
            let carried = u.manifest.carried().count() + 1;
            let linked = u.manifest.members.len() + 1 - carried;
            let from_base = if linked > 0 {
                format!(", {linked} taken from the base unpacked beside it")
            } else {
                String::new()
            };
            println!(
                "unpacked {} into {} ({carried} members verified{from_base})",
                bundle.display(),
                u.dir.display()
            )
        }
        _ => println!("{} is already unpacked in {}; nothing to do", bundle.display(), u.dir.display()),
    }
    Ok(())
}

/// What `mirror` pushed, as text or JSON.
pub fn print_mirrored(r: &ops::mirror::MirrorReport, output: Output) -> anyhow::Result<()> {
    let s = &r.summary;
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(s)?),
        _ => println!(
            "mirrored {} images ({} manifests) to {}: {} blobs uploaded ({} bytes), {} already present",
            s.images, s.manifests, r.registry, s.blobs_uploaded, s.bytes_uploaded, s.blobs_present
        ),
    }
    Ok(())
}

/// What `packages` did; the hosts that failed as the error.
pub fn print_packages(report: ops::packages::PackagesReport) -> anyhow::Result<()> {
    print!("{}", report.text);
    match report.errors {
        None => Ok(()),
        Some(e) => Err(classified(Class::Host, anyhow::anyhow!(e))),
    }
}
