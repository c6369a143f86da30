//! `kubexm-install`: the offline side of kubexm. Thin: flags in, one library
//! call, output or an error with its documented exit code.

use std::io::Read;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use kubexm_cli::{Class, Output, classified};
use kubexm_installer::ops::session::{Config, Session, Settings};
use kubexm_installer::{ops, serve, unpack};

mod args;
mod day2;
mod exit_codes;
mod output;
use args::{Cli, Command, EngineArgs, InstallArgs, ServeArgs, TrustArgs, UpgradeArgs};
use day2::{certs, cluster_record, delete, etcd, print_reset, remove};
use output::{print_facts, print_mirrored, print_packages, print_paths, print_serving, print_unpacked};

fn main() -> ExitCode {
    let cli = Cli::parse();
    kubexm_cli::init_logging(cli.verbose.max(1));
    kubexm_cli::exit(run(cli), exit_codes::kind)
}

fn trust(t: &TrustArgs) -> unpack::Trust {
    if t.pubkey.is_none() {
        warn_unsigned();
    }
    trust_of(t)
}

fn trust_of(t: &TrustArgs) -> unpack::Trust {
    unpack::Trust::of(t.pubkey.as_deref())
}

/// `--base`: the differential `bundle` and its base verified, and the base
/// unpacked under the root (never under --allow-unsigned).
fn with_base(bundle: &std::path::Path, t: &TrustArgs) -> anyhow::Result<()> {
    let Some(base) = &t.base else { return Ok(()) };
    let trust = trust_of(t);
    unpack::refuse_unsigned_base(base, &trust)
        .and_then(|()| unpack::unpack_base(bundle, base, &trust, &t.root))
        .map_err(unpack::UnpackError::classified)
}

/// The loud warning every command taking a bundle gives under --allow-unsigned.
fn warn_unsigned() {
    eprintln!("WARNING: --allow-unsigned: this bundle's origin is NOT verified. Anyone who could change it could run code on every node.");
}

fn run(cli: Cli) -> anyhow::Result<()> {
    refuse_catalog(&cli)?;
    let Some(command) = cli.command else { return install(cli.install) };
    match command {
        Command::Unpack { bundle, trust: t, output } => {
            with_base(&bundle, &t)?;
            let u = ops::unpack(&bundle, &trust(&t), &t.root)?;
            print_unpacked(&bundle, &u, output)
        }
        Command::Serve(a) => serve_bundle(a),
        Command::Mirror {
            bundle,
            trust: t,
            registry,
            flatten,
            username,
            password_stdin,
            ca_file,
            insecure,
            plain_http,
            jobs,
            output,
        } => {
            with_base(&bundle, &t)?;
            let password = password_stdin.then(read_password).transpose()?;
            let r = ops::mirror::mirror(ops::mirror::MirrorRequest {
                bundle,
                trust: trust(&t),
                root: t.root,
                registry,
                push: kubexm_installer::mirror::Push {
                    flatten,
                    username,
                    password,
                    ca_file,
                    insecure,
                    plain_http,
                    jobs,
                },
            })?;
            print_mirrored(&r, output)
        }
        Command::Facts {
            file,
            unreachable,
            engine,
            dry_run,
            graph,
            output,
        } => {
            let session = hosts_session(file, &engine, kubexm_installer::ROOT.into(), &unreachable)?;
            let report = ops::facts::facts(&session, &ops::facts::FactsOptions { dry_run, graph })?;
            print_facts(report, output)
        }
        Command::Packages {
            file,
            bundle_dir,
            file_server,
            host_ca,
            dry_run,
            engine,
        } => {
            let opts = ops::packages::PackagesOptions {
                file,
                bundle_dir,
                file_server,
                host_ca,
                dry_run,
                engine: engine.settings(),
            };
            print_packages(ops::packages::packages(&opts)?)
        }
        Command::Reset {
            file,
            yes,
            unreachable,
            root,
            engine,
        } => print_reset(ops::reset::reset(&hosts_session(file, &engine, root, &unreachable)?, yes)?),
        Command::Status {
            job,
            cluster,
            state,
            timeline,
            from,
            output,
        } => match (from, cluster) {
            (Some(from), _) => draw(&from, timeline.as_deref(), output),
            (None, Some(cluster)) => cluster_record(&state, &cluster, output),
            (None, None) => status(&state, job, timeline.as_deref(), output),
        },
        Command::Conformance(a) => conformance(a),
        Command::Apply(a) => apply(a),
        Command::Upgrade(u) => upgrade(u),
        Command::Etcd(e) => etcd(e),
        Command::Remove(r) => remove(r),
        Command::Delete(d) => delete(d),
        Command::Certs(c) => certs(c),
        Command::HostsToml {
            bundle_dir,
            registry,
            flatten,
            ca,
            plain_http,
            out,
        } => print_paths(ops::hosts_toml::hosts_toml(&ops::hosts_toml::HostsTomlOptions {
            bundle_dir,
            registry,
            flatten,
            ca,
            plain_http,
            out,
        })?),
    }
}

/// `serve`: until the process ends, with what it serves printed once it listens.
fn serve_bundle(a: ServeArgs) -> anyhow::Result<()> {
    let start = Instant::now();
    let (plain_http, listen) = (a.plain_http, a.listen);
    let r = ops::serve::ServeRequest {
        bundle_dir: a.bundle_dir,
        older: a.older,
        listen,
        tls_cert: a.tls_cert,
        tls_key: a.tls_key,
        tls_sans: a.tls_sans,
        pki_dir: a.pki_dir,
        plain_http,
        parts: serve::Parts {
            registry: !a.no_registry,
            files: !a.no_files,
        },
        limits: serve::ConnectionLimits {
            max: a.max_connections,
            per_source: a.max_per_source,
            nodes: a.nodes,
        },
        client_ca: a.client_ca,
    };
    ops::serve::serve(r, |s, ca| print_serving(s, ca, plain_http, listen, start))
}

/// The format of a timeline `-o` asks for.
fn timeline_format(output: Output) -> anyhow::Result<ops::status::TimelineFormat> {
    match output {
        Output::Json => Ok(ops::status::TimelineFormat::Json),
        Output::Text => Ok(ops::status::TimelineFormat::Svg),
        other => Err(ops::error::op(
            ops::error::OpError::Usage,
            anyhow::anyhow!(
                "status writes -o text (with --timeline: an SVG) or -o json, not {}",
                format!("{other:?}").to_lowercase()
            ),
        )),
    }
}

/// `status --from JSON --timeline FILE`: a timeline written earlier, drawn.
fn draw(from: &std::path::Path, file: Option<&std::path::Path>, output: Output) -> anyhow::Result<()> {
    let t = ops::status::read_timeline(from)?;
    if let Some(file) = file {
        ops::status::write_timeline(&t, timeline_format(output)?, file)?;
        print!("{}", t.summary());
    }
    Ok(())
}

/// `status`: the job's steps, or its timeline (to a file, or as JSON on stdout).
fn status(state: &std::path::Path, job: Option<i64>, file: Option<&std::path::Path>, output: Output) -> anyhow::Result<()> {
    use ops::status::TimelineFormat;
    let format = timeline_format(output)?;
    match (file, format) {
        (Some(file), format) => {
            let t = ops::status::timeline(state, job)?;
            ops::status::write_timeline(&t, format, file)?;
            eprintln!("wrote the timeline of job {} to {}", t.job, file.display());
            print!("{}", t.summary());
        }
        (None, TimelineFormat::Json) => {
            let t = ops::status::timeline(state, job)?;
            std::io::Write::write_all(&mut std::io::stdout(), &ops::status::render(&t, format)?)?;
        }
        (None, TimelineFormat::Svg) => print!("{}", ops::status::status(state, job)?),
    }
    Ok(())
}

impl EngineArgs {
    fn settings(&self) -> ops::EngineSettings {
        ops::EngineSettings {
            state: self.state.clone(),
            accept_new_host_key: self.accept_new_host_key,
            concurrency: self.concurrency,
            // The one printer: bars on a terminal, lines otherwise.
            events: Some(std::sync::Arc::new(kubexm_cli::progress::Printer::for_stderr())),
            stop: None,
            // The operator's own config, typed on this machine.
            trust: Default::default(),
            connect_timeout: std::time::Duration::from_secs(self.connect_timeout.max(1)),
            connect_attempts: self.connect_attempts.max(1),
            owner: if self.force_local {
                ops::owner::Ownership::ForceLocal
            } else {
                ops::owner::Ownership::default()
            },
        }
    }
}

/// A session over the hosts of `file` (no bundle), those named
/// `unreachable` left out: facts and reset.
fn hosts_session(
    file: std::path::PathBuf,
    engine: &EngineArgs,
    root: std::path::PathBuf,
    unreachable: &[String],
) -> anyhow::Result<Session> {
    let settings = Settings {
        root,
        ..Settings::engine_only(engine.settings())
    };
    let mut session = Session::open(&Config::File(file), None, None, settings)?;
    session.unreachable(unreachable)?;
    Ok(session)
}

/// `apply`: the config checked against the cluster's record, then only
/// what the difference needs.
fn apply(args: InstallArgs) -> anyhow::Result<()> {
    if !args.phases.is_empty() || args.server_dry_run {
        return Err(classified(
            Class::Usage,
            anyhow::anyhow!("apply takes no --phases or --server-dry-run: it runs what the change needs"),
        ));
    }
    let Some(file) = args.file.clone() else {
        return Err(classified(
            Class::Usage,
            anyhow::anyhow!("pass -f cluster.yaml (the changed config)"),
        ));
    };
    let (dry_run, files_from_registry) = (args.dry_run, args.files_from_registry);
    // Without --bundle: the one the record names, unpacked here by the install.
    let session = if args.bundle.is_none() {
        if args.pubkey.is_some() || args.allow_unsigned {
            return Err(classified(
                Class::Usage,
                anyhow::anyhow!(
                    "--pubkey and --allow-unsigned go with --bundle; without it apply takes the bundle the cluster's record names, \
                     as unpacked (and checked) by its install"
                ),
            ));
        }
        ops::apply::recorded_session(&Config::File(file), settings_of(args))?
    } else {
        bundle_session(file, args)?
    };
    print!(
        "{}",
        ops::apply::apply(
            &session,
            &ops::apply::ApplyOptions {
                dry_run,
                expect_digest: None,
                files_from_registry,
            }
        )?
    );
    Ok(())
}

/// `upgrade`: the version rules checked, the chain of hops printed.
fn upgrade(args: UpgradeArgs) -> anyhow::Result<()> {
    if args.trust.pubkey.is_none() {
        warn_unsigned();
    }
    if let Some(base) = &args.trust.base {
        unpack::refuse_unsigned_base(base, &trust_of(&args.trust)).map_err(unpack::UnpackError::classified)?;
        let differential = args
            .bundle
            .iter()
            .any(|b| kubexm_bundle::verify::read_manifest(b).is_ok_and(|m| m.base.is_some()));
        if !differential {
            return Err(classified(
                Class::Usage,
                anyhow::anyhow!(
                    "--base {}: none of the bundles given is a differential bundle; leave --base out",
                    base.display()
                ),
            ));
        }
    }
    let settings = Settings {
        root: args.trust.root,
        pubkey: args.trust.pubkey,
        base: args.trust.base,
        advertise: args.served.advertise,
        serve_port: args.served.serve_port,
        kubeconfig: args.served.kubeconfig,
        ..Settings::engine_only(args.engine.settings())
    };
    let (session, hop_bundles) = ops::upgrade::open(&Config::File(args.file), &args.bundle, settings)?;
    let plan = ops::upgrade::upgrade(
        &session,
        &ops::upgrade::UpgradeOptions {
            hop_bundles,
            skip_not_ready: args.skip_not_ready,
            dry_run: args.dry_run,
            expect_digest: None,
            drain_timeout: args.drain_timeout,
        },
    )?;
    print!("{plan}");
    Ok(())
}

/// The install: one operation, its report printed.
fn install(args: InstallArgs) -> anyhow::Result<()> {
    let Some(file) = args.file.clone() else {
        return Err(classified(
            Class::Usage,
            anyhow::anyhow!("nothing to do: pass -f cluster.yaml --bundle k.tar.zst to install, or a subcommand (see --help)"),
        ));
    };
    let phases = kubexm_installer::pipelines::install::parse(&args.phases)
        .map_err(|e| classified(Class::Usage, anyhow::anyhow!("--phases: {e}")))?;
    let opts = ops::install::InstallOptions {
        phases,
        dry_run: args.dry_run,
        server_dry_run: args.server_dry_run,
        expect_digest: None,
        apply: false,
        etcd_before: None,
        upgrade: None,
        files_from_registry: args.files_from_registry,
    };
    let session = bundle_session(file, args)?;
    print!("{}", ops::install::install(&session, &opts)?);
    Ok(())
}

/// A session of `file` with the bundle and trust decision `args` give.
fn bundle_session(file: std::path::PathBuf, args: InstallArgs) -> anyhow::Result<Session> {
    let Some(bundle) = args.bundle.clone() else {
        return Err(classified(
            Class::Usage,
            anyhow::anyhow!("pass --bundle k.tar.zst (built by kubexm-bundle)"),
        ));
    };
    if args.pubkey.is_none() && !args.allow_unsigned {
        return Err(classified(
            Class::Usage,
            anyhow::anyhow!("pass --pubkey FILE to verify the bundle's signature (or --allow-unsigned)"),
        ));
    }
    if args.pubkey.is_none() {
        warn_unsigned();
    }
    // The base is verified and unpacked with the bundle, by the operation.
    if let Some(base) = &args.base {
        unpack::refuse_unsigned_base(base, &unpack::Trust::of(args.pubkey.as_deref())).map_err(unpack::UnpackError::classified)?;
        let m = kubexm_bundle::verify::read_manifest(&bundle).map_err(|e| unpack::UnpackError::from(e).classified())?;
        unpack::check_deploy(&bundle, &m, Some(base), &unpack::Trust::of(args.pubkey.as_deref()), false)
            .map_err(unpack::UnpackError::classified)?;
    }
    Session::open(&Config::File(file), Some(&bundle), None, settings_of(args))
}

/// The machine's settings an install's or apply's flags give.
fn settings_of(args: InstallArgs) -> Settings {
    Settings {
        engine: args.engine.settings(),
        root: args.root,
        pubkey: args.pubkey,
        base: args.base,
        advertise: args.served.advertise,
        serve_port: args.served.serve_port,
        kubeconfig: args.served.kubeconfig,
        installer: None,
    }
}

/// kubexm-install takes no catalog: the bundle's lock carries it.
fn refuse_catalog(cli: &Cli) -> anyhow::Result<()> {
    if !cli.catalog.is_empty() {
        return Err(classified(
            Class::Usage,
            anyhow::anyhow!(
                "--catalog is not taken by kubexm-install: the bundle's lock carries what it needs from the catalog; \
                 pass --catalog to kubexm-bundle when building the bundle"
            ),
        ));
    }
    Ok(())
}

/// The registry password from standard input (never the command line).
fn read_password() -> anyhow::Result<String> {
    let mut p = String::new();
    std::io::stdin().read_to_string(&mut p)?;
    Ok(p.trim_end_matches(['\n', '\r']).to_string())
}

/// `conformance`: checks, the run, its summary; a failed spec is a failure
/// of the cluster (exit 7).
fn conformance(a: args::ConformanceArgs) -> anyhow::Result<()> {
    let output = a.output;
    let o = &ops::conformance::ConformanceOptions {
        cluster: a.cluster,
        root: a.root,
        state: a.state,
        bundle_dir: a.bundle_dir,
        kubeconfig: a.kubeconfig,
        mode: match a.mode {
            args::ConformanceMode::Quick => ops::conformance::Mode::Quick,
            args::ConformanceMode::Certified => ops::conformance::Mode::Certified,
        },
        focus: a.focus,
        skip: a.skip,
        parallel: a.parallel,
        allow_not_ready: a.allow_not_ready,
        flake_attempts: a.flake_attempts,
    };
    if !matches!(output, Output::Text | Output::Json) {
        return Err(ops::error::op(
            ops::error::OpError::Usage,
            anyhow::anyhow!(
                "conformance writes -o text or -o json, not {}",
                format!("{output:?}").to_lowercase()
            ),
        ));
    }
    let prepared = ops::conformance::prepare(o)?;
    eprintln!("conformance: results in {}", prepared.out.display());
    let summary = ops::conformance::run(&prepared)?;
    if matches!(output, Output::Json) {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        println!("{summary}");
    }
    if summary.ok() {
        Ok(())
    } else {
        Err(ops::error::op(
            ops::error::OpError::Host,
            match summary.failed + summary.not_run.len() {
                0 => anyhow::anyhow!(
                    "no spec failed, but ginkgo exited with {} (interrupted, or an error of the suite itself); see {}",
                    summary.exit_code.map_or("a signal".to_string(), |c| format!("code {c}")),
                    summary.log
                ),
                n => anyhow::anyhow!("{n} of the selected specs failed or did not run; see {}", summary.log),
            },
        ))
    }
}
