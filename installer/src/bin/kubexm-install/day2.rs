//! The day-2 commands' handlers (`etcd`, `remove`, `certs`, `delete`,
//! `status --cluster`): flags in, one operation, its report printed.

use kubexm_cli::{Class, Output, classified};
use kubexm_installer::ops;
use kubexm_installer::ops::session::{Config, Session, Settings};

use crate::args;
use crate::output::print;
use crate::{hosts_session, timeline_format};

/// `etcd snapshot`: one snapshot, as text or JSON.
pub fn etcd(command: args::EtcdCommand) -> anyhow::Result<()> {
    match command {
        args::EtcdCommand::Snapshot {
            cluster,
            keep,
            dir,
            output,
        } => {
            let session = cluster_session(cluster)?;
            let s = ops::etcd::snapshot(&session, &ops::etcd::SnapshotOptions { keep, dir, label: None })?;
            print(&s, output)
        }
        args::EtcdCommand::Restore {
            cluster,
            snapshot,
            yes,
            output,
        } => {
            let session = cluster_session(cluster)?;
            let o = ops::etcd_restore::RestoreOptions { snapshot, yes };
            match ops::etcd_restore::restore(&session, &o)? {
                ops::etcd_restore::RestoreReport::NotConfirmed { plan, refusal } => {
                    print!("{plan}");
                    Err(classified(Class::Usage, anyhow::anyhow!(refusal)))
                }
                ops::etcd_restore::RestoreReport::Restored(r) => print(&r, output),
            }
        }
    }
}

/// `remove node`: the hosts taken out, as text or JSON.
pub fn remove(command: args::RemoveCommand) -> anyhow::Result<()> {
    let args::RemoveCommand::Node {
        hosts,
        cluster,
        drain_timeout,
        force_drain,
        dry_run,
        output,
    } = command;
    // The hosts named unreachable are checked against the record, not the file.
    let unreachable = cluster.unreachable.clone();
    let mut session = hosts_session(cluster.file, &cluster.engine, cluster.root, &[])?;
    let o = ops::remove::RemoveOptions {
        hosts,
        unreachable,
        drain_timeout: std::time::Duration::from_secs(drain_timeout),
        force_drain,
        dry_run,
    };
    match ops::remove::remove(&mut session, &o)? {
        ops::remove::RemoveReport::Plan(plan) => {
            print!("{plan}");
            Ok(())
        }
        ops::remove::RemoveReport::Removed(r) => print(&r, output),
    }
}

/// `certs check`: every certificate with its expiry; exits 7 when one
/// expires within --warn-days (the list printed first). `certs renew`:
/// what it renewed.
pub fn certs(command: args::CertsCommand) -> anyhow::Result<()> {
    match command {
        args::CertsCommand::Check {
            cluster,
            warn_days,
            output,
        } => {
            let session = cluster_session(cluster)?;
            let r = ops::certs::check(&session, warn_days)?;
            print(&r, output)?;
            r.expiring_error()
        }
        args::CertsCommand::Renew {
            cluster,
            within,
            all,
            output,
        } => {
            let session = cluster_session(cluster)?;
            let o = ops::certs_renew::RenewOptions { within_days: within, all };
            print(&ops::certs_renew::renew(&session, &o)?, output)
        }
    }
}

/// A session over the hosts of the cluster's config, those named
/// unreachable left out.
pub fn cluster_session(c: args::ClusterArgs) -> anyhow::Result<Session> {
    hosts_session(c.file, &c.engine, c.root, &c.unreachable)
}

/// `delete cluster NAME`: what was reset, removed and kept, as text or JSON.
pub fn delete(command: args::DeleteCommand) -> anyhow::Result<()> {
    let args::DeleteCommand::Cluster {
        name,
        yes,
        purge,
        file,
        unreachable,
        root,
        output,
        engine,
    } = command;
    let settings = Settings {
        root,
        ..Settings::engine_only(engine.settings())
    };
    let from_file = file.is_some();
    let mut session = match file {
        Some(f) => {
            let s = Session::open(&Config::File(f.clone()), None, None, settings)?;
            if s.cluster().metadata.name != name {
                return Err(classified(
                    Class::Usage,
                    anyhow::anyhow!("{} is the config of cluster {}, not {name}", f.display(), s.cluster().metadata.name),
                ));
            }
            s
        }
        None => {
            let record = ops::status::record(&engine.state, &name)?;
            Session::of(record.config, format!("the record of cluster {name}"), settings)
        }
    };
    let o = ops::delete::DeleteOptions { yes, purge, unreachable };
    match ops::delete::delete(&mut session, from_file, &o)? {
        ops::delete::DeleteReport::NotConfirmed { plan, refusal } => {
            print!("{plan}");
            Err(classified(Class::Usage, anyhow::anyhow!(refusal)))
        }
        ops::delete::DeleteReport::Deleted(d) => print(&d, output),
    }
}

/// `status --cluster NAME`: the cluster's record, as text or JSON.
pub fn cluster_record(state: &std::path::Path, cluster: &str, output: Output) -> anyhow::Result<()> {
    let format = timeline_format(output)?;
    let record = ops::status::record(state, cluster)?;
    match format {
        ops::status::TimelineFormat::Json => println!("{}", serde_json::to_string_pretty(&record)?),
        ops::status::TimelineFormat::Svg => print!("{record}"),
    }
    Ok(())
}

/// What `reset` prints: the plan and the refusal without `--yes`, else its line.
pub fn print_reset(report: ops::reset::ResetReport) -> anyhow::Result<()> {
    match report {
        ops::reset::ResetReport::NotConfirmed { plan, refusal } => {
            print!("{plan}");
            Err(classified(Class::Usage, anyhow::anyhow!(refusal)))
        }
        ops::reset::ResetReport::Done(reset) => {
            println!("{reset}");
            Ok(())
        }
    }
}
