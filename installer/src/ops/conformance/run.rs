//! Running the suite: NotReady nodes checked (only those allowed by name
//! may be), `ginkgo` over `e2e.test` with its output teed to `e2e.log` and
//! a progress line per finished spec, then the summary from the JUnit
//! report, written beside it.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use serde::Serialize;

use super::Prepared;
use super::junit::{self, Status};
use crate::ops::error::{OpError, op};

/// What a run found.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub cluster: String,
    pub kubernetes_version: String,
    pub passed: usize,
    pub failed: usize,
    /// Specs selected but skipped by the suite itself (a provider or
    /// feature it lacks).
    pub skipped: usize,
    pub duration_seconds: f64,
    /// Names of the failed specs.
    pub failures: Vec<String>,
    /// Why each failed spec failed, by name (the report's failure message).
    pub failure_messages: std::collections::BTreeMap<String, String>,
    /// Specs that failed, then passed on another attempt (`--flake-attempts`).
    pub flaky: Vec<String>,
    /// Listed specs (quick mode) that did not run (skipped or missing).
    pub not_run: Vec<String>,
    /// Nodes NotReady during the run, allowed by name.
    pub not_ready_nodes: Vec<String>,
    /// Images a pod failed to pull during the run, by reference.
    pub pull_failures: Vec<String>,
    /// ginkgo's exit code.
    pub exit_code: Option<i32>,
    pub junit: String,
    pub log: String,
}

impl Summary {
    /// Whether every selected spec passed.
    pub fn ok(&self) -> bool {
        self.failed == 0 && self.not_run.is_empty() && self.exit_code == Some(0)
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "conformance of {} (Kubernetes {}): {} passed, {} failed, {} skipped in {:.0} s",
            self.cluster, self.kubernetes_version, self.passed, self.failed, self.skipped, self.duration_seconds
        )?;
        for n in &self.failures {
            writeln!(f, "  failed: {}", printable(n))?;
            if let Some(m) = self.failure_messages.get(n) {
                writeln!(f, "    why: {}", printable(&clipped(m, 600)))?;
            }
        }
        for n in &self.flaky {
            writeln!(f, "  flaky (failed, then passed on another attempt): {}", printable(n))?;
        }
        for n in &self.not_run {
            writeln!(f, "  listed but not run: {}", printable(n))?;
        }
        for i in &self.pull_failures {
            writeln!(
                f,
                "  a pod failed to pull {}: is it in the bundle, and does the nodes' registry mirror serve it?",
                printable(i)
            )?;
        }
        if !self.not_ready_nodes.is_empty() {
            let nodes: Vec<String> = self.not_ready_nodes.iter().map(|n| printable(n)).collect();
            writeln!(f, "  NotReady nodes allowed: {}", nodes.join(", "))?;
        }
        write!(f, "  JUnit report: {}\n  log: {}", self.junit, self.log)
    }
}

/// Runs the suite `p` describes; the summary is also written as
/// `summary.json` and `summary.txt` beside the report.
pub fn run(p: &Prepared) -> anyhow::Result<Summary> {
    let not_ready = not_ready_nodes(p)?;
    let refused: Vec<&String> = not_ready.iter().filter(|n| !p.allow_not_ready.contains(n)).collect();
    if !refused.is_empty() {
        return Err(op(
            OpError::Host,
            anyhow::anyhow!(
                "NotReady nodes: {}; the tests would wait for them: fix them, or allow them by name with --allow-not-ready",
                refused.iter().map(|s| printable(s)).collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    fs_err::create_dir_all(&p.out).map_err(|e| op(OpError::Io, e))?;
    let log_path = p.out.join("e2e.log");
    let started = Instant::now();
    let exit_code = ginkgo(p, &log_path, not_ready.len())?;
    let duration_seconds = started.elapsed().as_secs_f64();
    let junit_path = p.out.join("junit_01.xml");
    let xml = fs_err::read_to_string(&junit_path).map_err(|e| {
        op(
            OpError::Host,
            anyhow::anyhow!("the suite wrote no report ({e}); see {}", log_path.display()),
        )
    })?;
    let cases = junit::cases(&xml).map_err(|e| op(OpError::Host, anyhow::anyhow!("{}: {e}", junit_path.display())))?;
    let selected = |name: &str| p.listed.is_empty() || p.listed.iter().any(|l| l.name == name);
    let ran: Vec<_> = cases
        .iter()
        .filter(|c| !c.suite && c.status != Status::Skipped && selected(&c.name))
        .collect();
    let passed = ran.iter().filter(|c| c.status == Status::Passed).count();
    // A failed spec, or a failed suite node (a before-suite failure skips every spec).
    let failed: Vec<&junit::Case> = ran
        .iter()
        .copied()
        .chain(cases.iter().filter(|c| c.suite))
        .filter(|c| c.status == Status::Failed)
        .collect();
    let failures: Vec<String> = failed.iter().map(|c| c.name.clone()).collect();
    let failure_messages = failed.iter().filter_map(|c| Some((c.name.clone(), c.message.clone()?))).collect();
    let scanned = scan_log(&log_path);
    let (will_run, pulls) = (scanned.will_run, scanned.pulls);
    let not_run: Vec<String> = p
        .listed
        .iter()
        .filter(|l| !ran.iter().any(|c| c.name == l.name))
        .filter(|l| !(p.user_skip && cases.iter().any(|c| !c.suite && c.name == l.name && c.status == Status::Skipped)))
        .map(|l| l.name.clone())
        .collect();
    let summary = Summary {
        cluster: p.cluster.clone(),
        kubernetes_version: p.version.clone(),
        passed,
        failed: failures.len(),
        skipped: will_run.map_or(0, |n| n.saturating_sub(ran.len())),
        duration_seconds,
        failures,
        failure_messages,
        flaky: scanned.flaky,
        not_run,
        not_ready_nodes: not_ready,
        pull_failures: pulls,
        exit_code,
        junit: junit_path.display().to_string(),
        log: log_path.display().to_string(),
    };
    let json = serde_json::to_vec_pretty(&summary)?;
    kubexm_bundle::files::write_atomic(&p.out.join("summary.json"), &json).map_err(|e| op(OpError::Io, e))?;
    kubexm_bundle::files::write_atomic(&p.out.join("summary.txt"), format!("{summary}\n").as_bytes()).map_err(|e| op(OpError::Io, e))?;
    Ok(summary)
}

/// The cluster's NotReady nodes, by name.
fn not_ready_nodes(p: &Prepared) -> anyhow::Result<Vec<String>> {
    let out = Command::new(&p.kubectl)
        .arg("--kubeconfig")
        .arg(&p.kubeconfig)
        .args(["get", "nodes", "--no-headers", "--request-timeout=20s"])
        .output()
        .map_err(|e| op(OpError::Io, anyhow::anyhow!("{}: {e}", p.kubectl.display())))?;
    if !out.status.success() {
        return Err(op(
            OpError::Host,
            anyhow::anyhow!(
                "kubectl get nodes with {} failed: {}",
                p.kubeconfig.display(),
                printable(String::from_utf8_lossy(&out.stderr).trim())
            ),
        ));
    }
    Ok(not_ready_in(&String::from_utf8_lossy(&out.stdout)))
}

/// Names of the nodes whose STATUS (second column) is not `Ready`
/// (`Ready,SchedulingDisabled` counts as ready).
fn not_ready_in(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (name, status) = (f.next()?, f.next()?);
            (status.split(',').next() != Some("Ready")).then(|| name.to_string())
        })
        .collect()
}

/// Runs ginkgo, teeing its output into `log` and reporting progress on
/// stderr; its exit code.
fn ginkgo(p: &Prepared, log: &Path, not_ready: usize) -> anyhow::Result<Option<i32>> {
    let mut cmd = Command::new(&p.ginkgo);
    cmd.arg(format!("--procs={}", p.parallel))
        .args(["--timeout=24h", "--no-color", "-v", "--poll-progress-after=10m"])
        .arg(format!("--focus={}", p.focus));
    if p.flake_attempts > 1 {
        cmd.arg(format!("--flake-attempts={}", p.flake_attempts));
    }
    if !p.skip.is_empty() {
        cmd.arg(format!("--skip={}", p.skip));
    }
    cmd.arg(&p.e2e)
        .arg("--")
        .arg(format!("--kubeconfig={}", p.kubeconfig.display()))
        .args(["--provider=skeleton", "--disable-log-dump"])
        .arg(format!("--kubectl-path={}", p.kubectl.display()))
        .arg(format!("--report-dir={}", p.out.display()))
        // kubexm checked every node itself (only nodes allowed by name may
        // be NotReady): with one allowed, e2e.test's own wait for the
        // DaemonSets on it would only time out (5 minutes) before each run.
        .arg(format!("--allowed-not-ready-nodes={}", if not_ready == 0 { 0 } else { -1 }))
        .env("KUBECONFIG", &p.kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| op(OpError::Io, anyhow::anyhow!("{}: {e}", p.ginkgo.display())))?;
    let log_file = fs_err::File::create(log).map_err(|e| op(OpError::Io, e))?;
    let log_file = std::sync::Arc::new(std::sync::Mutex::new(log_file));
    let stderr = child.stderr.take().map(|s| {
        let log_file = log_file.clone();
        std::thread::spawn(move || {
            each_line(s, |bytes, _| append(&log_file, bytes));
        })
    });
    let mut progress = Progress::default();
    if let Some(out) = child.stdout.take() {
        each_line(out, |bytes, line| {
            append(&log_file, bytes);
            if let Some(report) = progress.line(line) {
                eprintln!("{report}");
            }
        });
    }
    if let Some(t) = stderr {
        let _ = t.join();
    }
    let status = child.wait().map_err(|e| op(OpError::Io, e))?;
    Ok(status.code())
}

/// Calls `f` with each line of `r`, as read and as text (invalid UTF-8
/// replaced, so one bad byte neither ends the reading nor leaves ginkgo
/// writing into a closed pipe), until its end.
fn each_line(r: impl std::io::Read, mut f: impl FnMut(&[u8], &str)) {
    let mut r = BufReader::new(r);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match r.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
                f(line, &String::from_utf8_lossy(line));
            }
        }
    }
}

/// `line` and a newline onto the shared log.
fn append(log: &std::sync::Mutex<fs_err::File>, line: &[u8]) {
    if let Ok(mut f) = log.lock() {
        let _ = f.write_all(line).and_then(|()| f.write_all(b"\n"));
    }
}

/// Specs finished and failed so far, from ginkgo's verbose output.
#[derive(Debug, Default)]
struct Progress {
    total: Option<usize>,
    done: usize,
    failed: usize,
}

impl Progress {
    /// A progress line when `line` ends a spec (or announces the total).
    fn line(&mut self, line: &str) -> Option<String> {
        if let Some(n) = will_run_in(line) {
            self.total = Some(n);
            return Some(format!("conformance: {n} specs to run"));
        }
        let rest = header(line)?;
        let failed = ["FAILED]", "PANICKED]", "TIMEDOUT]", "INTERRUPTED]", "ABORTED]"]
            .iter()
            .any(|s| rest.starts_with(s));
        if !failed && !rest.starts_with(|c: char| c.is_ascii_digit()) && !rest.starts_with(FLAKY) {
            return None;
        }
        self.done += 1;
        self.failed += usize::from(failed);
        let total = self.total.map_or(String::new(), |t| format!(" of {t}"));
        Some(format!("conformance: {}{total} specs done, {} failed", self.done, self.failed))
    }
}

/// `Will run 56 of 7212 specs` → 56.
fn will_run_in(line: &str) -> Option<usize> {
    let rest = line.trim().strip_prefix("Will run ")?;
    let (n, tail) = rest.split_once(' ')?;
    tail.starts_with("of ").then(|| n.parse().ok()).flatten()
}

/// How ginkgo's verbose output starts the header of a spec that passed on a
/// later attempt (`↺ [FLAKEY TEST - TOOK 2 ATTEMPTS TO PASS] [12.3 seconds]`);
/// the spec's text is on the next line.
const FLAKY: &str = "FLAKEY TEST";

/// After its denoter (`•` for a spec, `↺` for a retried one, `+` and `R` on
/// Windows), what a spec's report header in ginkgo's output says, from `[`
/// on: `FAILED] [30.001 seconds]`, `12.345 seconds]`.
fn header(line: &str) -> Option<&str> {
    let line = line.trim_start();
    ["• [", "↺ [", "+ [", "R ["].iter().find_map(|d| line.strip_prefix(d))
}

/// What the log says beside the report.
#[derive(Debug, Default, PartialEq)]
struct Scanned {
    /// The count ginkgo announced.
    will_run: Option<usize>,
    /// Images a pod failed to pull.
    pulls: Vec<String>,
    /// The text of each spec that passed on a later attempt.
    flaky: Vec<String>,
}

/// Reads the log a line at a time for what [`Scanned`] holds.
fn scan_log(log: &Path) -> Scanned {
    let mut out = Scanned::default();
    let mut pulls = std::collections::BTreeSet::new();
    let mut after_flaky = false;
    if let Ok(f) = fs_err::File::open(log) {
        each_line(f, |_, line| {
            out.will_run = out.will_run.or_else(|| will_run_in(line));
            pull_failures_in(line, &mut pulls);
            let text = line.trim();
            if after_flaky && !text.is_empty() {
                out.flaky.push(clipped(text, 300));
                after_flaky = false;
            } else if header(text).is_some_and(|r| r.starts_with(FLAKY)) {
                after_flaky = true;
            }
        });
    }
    out.pulls = pulls.into_iter().collect();
    out
}

/// `s` cut to `max` characters, marked when cut.
fn clipped(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// Images a pod failed to pull, from the events e2e.test dumps for a failed
/// spec's namespace (`Failed to pull image "REF": ...`, `Back-off pulling
/// image "REF"`, quotes escaped or not), into `out`.
fn pull_failures_in(line: &str, out: &mut std::collections::BTreeSet<String>) {
    for marker in ["Failed to pull image ", "Back-off pulling image "] {
        let mut rest = line;
        while let Some(at) = rest.find(marker) {
            rest = &rest[at + marker.len()..];
            let quoted = [r#"\""#, "\""].iter().find_map(|q| rest.strip_prefix(q).map(|r| (r, *q)));
            let Some((r, close)) = quoted else { continue };
            let Some(end) = r.find(close) else { continue };
            let image = &r[..end];
            if !image.is_empty() && image.len() <= 512 && image.chars().all(|c| c.is_ascii_graphic()) {
                out.insert(image.to_string());
            }
        }
    }
}

/// `s` with control characters, and the format and separator characters
/// that reorder or break a terminal's line (bidi overrides and isolates,
/// zero-width marks, line and paragraph separators, the BOM), shown as
/// escapes: spec names and errors come from the suite's output.
pub(crate) fn printable(s: &str) -> String {
    let hidden = |c: char| matches!(c as u32, 0x061C | 0x200B..=0x200F | 0x2028..=0x202E | 0x2060..=0x2069 | 0xFEFF);
    s.chars()
        .map(|c| {
            if c.is_control() || hidden(c) {
                format!("\\u{{{:x}}}", c as u32)
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_counts_finished_and_failed_specs() {
        let mut p = Progress::default();
        let out: Vec<_> = [
            "Running Suite: Kubernetes e2e suite - /root",
            "Will run 3 of 7212 specs",
            "------------------------------",
            "• [12.345 seconds]",
            "[sig-network] DNS should provide DNS for the cluster [Conformance]",
            "• [FAILED] [30.001 seconds]",
            "S [SKIPPED] [0.000 seconds]",
            "• [PANICKED] [1.0 seconds]",
            "↺ [FLAKEY TEST - TOOK 2 ATTEMPTS TO PASS] [61.200 seconds]",
            "•• a line that is not a report",
        ]
        .iter()
        .filter_map(|l| p.line(l))
        .collect();
        assert_eq!(
            out,
            [
                "conformance: 3 specs to run",
                "conformance: 1 of 3 specs done, 0 failed",
                "conformance: 2 of 3 specs done, 1 failed",
                "conformance: 3 of 3 specs done, 2 failed",
                "conformance: 4 of 3 specs done, 2 failed",
            ]
        );
    }

    #[test]
    fn the_log_names_specs_that_passed_on_a_later_attempt() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("e2e.log");
        fs_err::write(
            &log,
            [
                "Will run 2 of 7212 specs",
                "↺ [FLAKEY TEST - TOOK 2 ATTEMPTS TO PASS] [61.200 seconds]",
                "",
                "[sig-api-machinery] Aggregator Should be able to support the 1.17 Sample API Server",
                "• [3.100 seconds]",
                "[sig-node] Pods should get a host IP",
            ]
            .join("\n"),
        )?;
        let s = scan_log(&log);
        assert_eq!(s.will_run, Some(2));
        assert_eq!(
            s.flaky,
            ["[sig-api-machinery] Aggregator Should be able to support the 1.17 Sample API Server"]
        );
        Ok(())
    }

    #[test]
    fn the_summary_says_why_a_spec_failed_clipped_and_printable() {
        let s = Summary {
            cluster: "lab".into(),
            kubernetes_version: "v1.37.2".into(),
            passed: 1,
            failed: 1,
            skipped: 0,
            duration_seconds: 10.0,
            failures: vec!["[sig-a] spec".into()],
            failure_messages: [("[sig-a] spec".to_string(), format!("timed out\u{1b}[2J{}", "x".repeat(700)))].into(),
            flaky: vec!["[sig-b] other".into()],
            not_run: vec![],
            not_ready_nodes: vec![],
            pull_failures: vec![],
            exit_code: Some(1),
            junit: "j".into(),
            log: "l".into(),
        };
        let text = s.to_string();
        assert!(text.contains("  failed: [sig-a] spec\n    why: timed out\\u{1b}[2J"), "{text}");
        assert!(text.contains("x…\n"), "{text}");
        assert!(
            text.contains("  flaky (failed, then passed on another attempt): [sig-b] other"),
            "{text}"
        );
        assert!(!s.ok());
    }

    #[test]
    fn a_line_that_is_not_utf8_neither_ends_the_reading_nor_is_lost() {
        let mut lines = Vec::new();
        each_line(&b"a\xffb\nsecond\nlast without newline"[..], |bytes, text| {
            lines.push((bytes.to_vec(), text.to_string()))
        });
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], (b"a\xffb".to_vec(), "a\u{fffd}b".to_string()));
        assert_eq!(lines[2].1, "last without newline");
    }

    #[test]
    fn images_that_failed_to_pull_are_named_once() {
        let log = "I1126 dump.go:53] At 2026 - event for pod1: {kubelet lab4} Failed: Failed to pull image \"registry.k8s.io/e2e-test-images/agnhost:2.66.1\": rpc error\n\
                   event for pod2: {kubelet lab3} BackOff: Back-off pulling image \\\"registry.k8s.io/e2e-test-images/nginx:1.27.0-2\\\"\n\
                   Failed to pull image \"registry.k8s.io/e2e-test-images/agnhost:2.66.1\": again\n\
                   Failed to pull image \"unterminated\n";
        let pulls = |text: &str| {
            let mut out = std::collections::BTreeSet::new();
            text.lines().for_each(|l| pull_failures_in(l, &mut out));
            out.into_iter().collect::<Vec<_>>()
        };
        assert_eq!(
            pulls(log),
            [
                "registry.k8s.io/e2e-test-images/agnhost:2.66.1",
                "registry.k8s.io/e2e-test-images/nginx:1.27.0-2"
            ]
        );
        assert!(pulls("no failure here").is_empty());
    }

    #[test]
    fn not_ready_nodes_are_read_from_kubectl_get_nodes() {
        let listing = "lab1   Ready                      control-plane   5m    v1.37.2\n\
                       lab2   Ready,SchedulingDisabled   <none>          5m    v1.37.2\n\
                       lab5   NotReady                   <none>          4m    v1.37.2\n\
                       lab6   Unknown                    <none>          4m    v1.37.2\n";
        assert_eq!(not_ready_in(listing), ["lab5", "lab6"]);
    }

    #[test]
    fn spec_names_reach_the_terminal_without_control_characters() {
        assert_eq!(printable("a\u{1b}[2Jb\rc"), "a\\u{1b}[2Jb\\u{d}c");
        assert_eq!(printable("x\u{202e}y\u{2028}z"), "x\\u{202e}y\\u{2028}z");
    }
}
