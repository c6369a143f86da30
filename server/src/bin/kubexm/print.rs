//! How `kubexm` prints jobs: a job's head and log lines (text, JSON or
//! YAML, followed or not), the job list, a cancel's answer, times in UTC.

use std::io::Write;

use kubexm_server::jobdb::{Job, LogLine, Status};
use kubexm_server::ops;

use crate::args::Format;

pub(crate) fn print_cancelled(id: i64, s: Status) -> anyhow::Result<()> {
    if s == Status::Processing {
        println!("job {id}: cancel requested; its worker starts no new step and marks it Cancelled");
    } else {
        println!("job {id}: {}", s.as_str());
    }
    Ok(())
}

/// `get job` output, the same from the database or the API.
pub(crate) struct JobPrinter {
    output: Format,
    follow: bool,
}

impl JobPrinter {
    pub(crate) fn new(output: Format, follow: bool) -> JobPrinter {
        JobPrinter { output, follow }
    }

    pub(crate) fn head(&mut self, j: &Job) -> anyhow::Result<()> {
        if matches!(self.output, Format::Text) && !self.follow {
            print!("{}", describe(j));
            println!("Log:");
        }
        Ok(())
    }

    pub(crate) fn line(&mut self, l: &LogLine, keep: &mut Vec<LogLine>) {
        match self.output {
            Format::Text if self.follow => println!("{}", l.line),
            Format::Text => println!("  {:>5}  {}", l.seq, l.line),
            _ => keep.push(l.clone()),
        }
    }

    pub(crate) fn end(&self, j: &Job, logs: Vec<LogLine>) -> anyhow::Result<()> {
        let v = serde_json::json!({"job": j, "logs": logs});
        match self.output {
            Format::Text if self.follow => return ops::outcome(j),
            Format::Text => {}
            Format::Json => println!("{}", serde_json::to_string_pretty(&v)?),
            Format::Yaml => print!("{}", serde_saphyr::to_string(&v)?),
        }
        Ok(())
    }
}

pub(crate) fn print_jobs(jobs: &[Job], output: Format) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match output {
        Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&jobs)?)?,
        Format::Yaml => write!(out, "{}", serde_saphyr::to_string(&jobs)?)?,
        Format::Text => {
            writeln!(
                out,
                "{:<6} {:<16} {:<8} {:<10} {:<20} CURRENT STEP",
                "ID", "CLUSTER", "KIND", "STATUS", "CREATED"
            )?;
            for j in jobs {
                writeln!(
                    out,
                    "{:<6} {:<16} {:<8} {:<10} {:<20} {}",
                    j.id,
                    j.cluster,
                    j.kind,
                    j.status.as_str(),
                    utc(j.created),
                    j.current_step.as_deref().unwrap_or("-")
                )?;
            }
        }
    }
    Ok(())
}

/// A job for people.
pub(crate) fn describe(j: &Job) -> String {
    let t = |v: Option<i64>| v.map(utc).unwrap_or_else(|| "-".into());
    format!(
        "ID:           {}\nCluster:      {}\nKind:         {}\nCreated by:   {}\nStatus:       {}\nCurrent step: {}\nCreated:      {}\nStarted:      {}\nFinished:     {}\nAttempt:      {}{}\n{}",
        j.id,
        j.cluster,
        j.kind,
        j.principal.as_deref().unwrap_or("-"),
        j.status.as_str(),
        j.current_step.as_deref().unwrap_or("-"),
        utc(j.created),
        t(j.started),
        t(j.finished),
        j.attempt,
        j.worker.as_deref().map(|w| format!(" (worker {w})")).unwrap_or_default(),
        j.error.as_deref().map(|e| format!("Error:        {e}\n")).unwrap_or_default(),
    )
}

/// Milliseconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub(crate) fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = kubexm_installer::pki::civil_date(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    #[test]
    pub(crate) fn utc_formats_epoch_milliseconds() {
        assert_eq!(super::utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::utc(1_700_000_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(super::utc(951_782_400_000), "2000-02-29T00:00:00Z");
    }
}
