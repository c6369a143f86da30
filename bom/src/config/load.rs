//! Reading cluster.yaml: size limit, YAML, typed model, every rule, defaults.
//!
//! Raw text goes in once; a validated, completed [`Cluster`] comes out, or
//! every problem found, each with its path and line:column. Typed reading
//! keeps going past a bad key: the key is reported, removed from the
//! document and the read is tried again, so one typo does not hide the next.

use std::collections::BTreeSet;
use std::path::Path;

use super::defaults::complete;
use super::model::Cluster;
use super::{support, validate};
use crate::catalog::Catalog;
use crate::diag::{Diagnostic, Diagnostics, Kind, MAX_DIAGNOSTICS, did_you_mean};
use crate::yaml::{self, Located, Pos};

/// Larger files are refused before they are read.
pub const MAX_CONFIG_BYTES: u64 = 10 * 1024 * 1024;

/// The most hosts a cluster may have: Kubernetes' largest supported size.
pub const MAX_HOSTS: usize = 5_000;

/// Why a config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {file}: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file} is {size} bytes; a cluster config may be at most {MAX_CONFIG_BYTES} bytes (10 MB). Is this the right file?")]
    TooLarge { file: String, size: u64 },
    #[error(transparent)]
    Invalid(#[from] Diagnostics),
}

/// Reads, validates and completes a config file.
pub fn load_file(path: &Path, catalog: &Catalog) -> Result<Cluster, LoadError> {
    load_file_with(path, Some(catalog))
}

/// Reads and validates a config file for an operation that only reaches its
/// hosts (reset, facts): everything is checked except what needs a catalog
/// (versions, arches, OS releases), and versions are not filled in.
pub fn load_file_hosts(path: &Path) -> Result<Cluster, LoadError> {
    load_file_with(path, None)
}

/// Who wrote a config, and so what it may name on the machine that runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Origin {
    /// The operator, on the worker's machine: files, variables, key paths.
    #[default]
    Operator,
    /// A request (the API, a shared job database): named credentials only
    /// ([`super::untrusted`]).
    Request,
}

fn load_file_with(path: &Path, catalog: Option<&Catalog>) -> Result<Cluster, LoadError> {
    let file = path.display().to_string();
    let read_err = |source| LoadError::Read {
        file: file.clone(),
        source,
    };
    let size = fs_err::metadata(path).map_err(read_err)?.len();
    if size > MAX_CONFIG_BYTES {
        return Err(LoadError::TooLarge { file, size });
    }
    let bytes = fs_err::read(path).map_err(read_err)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(LoadError::TooLarge {
            file,
            size: bytes.len() as u64,
        });
    }
    match String::from_utf8(bytes) {
        Ok(text) => load_str_with(&text, &file, catalog, Origin::Operator),
        Err(e) => {
            let at = e.utf8_error().valid_up_to();
            let prefix = String::from_utf8_lossy(&e.as_bytes()[..at]);
            let line = prefix.matches('\n').count() as u32 + 1;
            let column = prefix.rsplit('\n').next().map_or(0, |l| l.chars().count()) as u32 + 1;
            let d = Diagnostic::new(Kind::Syntax, "", format!("byte {at} is not UTF-8 text; is this a binary file?"))
                .at(Some(Pos { line, column }));
            Err(Diagnostics {
                file,
                diagnostics: vec![d],
                more: 0,
            }
            .into())
        }
    }
}

/// Reads, validates and completes config text; `file` names it in messages.
pub fn load_str(text: &str, file: &str, catalog: &Catalog) -> Result<Cluster, LoadError> {
    load_str_with(text, file, Some(catalog), Origin::Operator)
}

/// Reads, validates and completes config text written by `origin`: a
/// request's is also held to [`super::untrusted`]'s rules. Without a
/// catalog, as [`load_str_hosts`].
pub fn load_str_as(text: &str, file: &str, catalog: Option<&Catalog>, origin: Origin) -> Result<Cluster, LoadError> {
    load_str_with(text, file, catalog, origin)
}

/// Validates config text for an operation that only reaches its hosts
/// (reset, facts), as [`load_file_hosts`] does a file.
pub fn load_str_hosts(text: &str, file: &str) -> Result<Cluster, LoadError> {
    load_str_with(text, file, None, Origin::Operator)
}

fn load_str_with(text: &str, file: &str, catalog: Option<&Catalog>, origin: Origin) -> Result<Cluster, LoadError> {
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(LoadError::TooLarge {
            file: file.into(),
            size: text.len() as u64,
        });
    }
    let fail = |mut diagnostics: Vec<Diagnostic>, more: usize| {
        let over = diagnostics.len().saturating_sub(MAX_DIAGNOSTICS);
        diagnostics.truncate(MAX_DIAGNOSTICS);
        LoadError::Invalid(Diagnostics {
            file: file.into(),
            diagnostics,
            more: more + over,
        })
    };
    let doc = match yaml::parse(text) {
        Ok(doc) => doc,
        Err(e) => {
            let d = Diagnostic::new(Kind::Syntax, "", e.message)
                .hint("fix the YAML syntax first; semantic checks run once the file parses")
                .at(e.pos);
            return Err(fail(vec![d], 0));
        }
    };
    let (cluster, mut diags, removed) = read_typed(doc.clone());
    let mut more = 0;
    // More hosts than a cluster may have: refused before any rule looks at
    // them (rules compare hosts with each other).
    if let Some(c) = &cluster {
        let g = &c.spec.role_groups;
        let largest = [&g.etcd, &g.control_plane, &g.worker, &g.loadbalancer, &g.registry]
            .iter()
            .map(|g| g.len())
            .chain([c.spec.hosts.len()])
            .max()
            .unwrap_or(0);
        if largest > MAX_HOSTS {
            let d = Diagnostic::new(
                Kind::Invalid,
                "spec.hosts",
                format!("{largest} hosts or role entries; a cluster has at most {MAX_HOSTS} hosts (Kubernetes' largest supported size)"),
            )
            .hint("split the machines into several clusters")
            .at(doc.pos("spec.hosts"));
            return Err(fail(vec![d], 0));
        }
    }
    if let Some(cluster) = &cluster {
        // A value already reported as badly typed was dropped and defaulted;
        // rules about that same path would only repeat the report.
        let fresh = |d: &Diagnostic| {
            !removed.iter().any(|r| {
                let parent = r.rsplit_once('.').map_or("", |(p, _)| p);
                d.path == *r || d.path == parent || d.path.starts_with(&format!("{r}."))
            })
        };
        let (rules, over) = validate::check_counted(cluster, catalog);
        more += over;
        diags.extend(rules.into_iter().filter(fresh));
        diags.extend(support::check(cluster).into_iter().filter(fresh));
        if origin == Origin::Request {
            diags.extend(super::untrusted::check(cluster).into_iter().filter(fresh));
        }
    }
    if !diags.is_empty() {
        for d in &mut diags {
            if d.line.is_none() {
                *d = d.clone().at(doc.pos(&d.path));
            }
        }
        diags.sort_by_key(|d| (d.line.unwrap_or(0), d.column.unwrap_or(0)));
        diags.dedup();
        return Err(fail(diags, more));
    }
    match cluster {
        Some(mut cluster) => {
            complete(&mut cluster, catalog);
            Ok(cluster)
        }
        None => Err(fail(Vec::new(), 0)),
    }
}

/// Typed deserialization that reports every unknown key and bad value.
/// Returns the cluster if it could be read at all, the problems, and the
/// paths removed on the way.
fn read_typed(mut doc: Located) -> (Option<Cluster>, Vec<Diagnostic>, BTreeSet<String>) {
    // `system:` with only comments under it is null; it means the same as
    // leaving the key out, so the section takes its defaults.
    prune_nulls(&mut doc.value);
    let mut diags = Vec::new();
    let mut removed = BTreeSet::new();
    // Each round removes one key, so the loop ends; the bound is a backstop.
    for _ in 0..10_000 {
        let err = match serde_path_to_error::deserialize::<_, Cluster>(&doc.value) {
            Ok(c) => return (Some(c), diags, removed),
            Err(e) => e,
        };
        let path = err.path().to_string();
        let path = if path == "." { String::new() } else { path };
        let message = err.inner().to_string();
        if let Some(field) = missing_field(&message) {
            let full = join(&path, field);
            if removed.contains(&full) {
                // Already reported as a bad value; do not report it twice.
                return (None, diags, removed);
            }
            diags.push(Diagnostic::new(Kind::Schema, full.clone(), format!("required key `{field}` is missing")).at(doc.pos(&path)));
            return (None, diags, removed);
        }
        let d = match unknown_field(&message) {
            Some((key, expected)) => {
                let mut d = Diagnostic::new(Kind::Schema, path.clone(), format!("unknown key `{key}`"));
                d = match did_you_mean(key, expected.iter().map(String::as_str)) {
                    Some(m) => d.hint(format!("did you mean `{m}`?")),
                    None if !expected.is_empty() => d.hint(format!("valid keys here: {}", expected.join(", "))),
                    None => d,
                };
                d
            }
            None => Diagnostic::new(Kind::Schema, path.clone(), humanize(&message)),
        };
        diags.push(d.at(doc.pos(&path)));
        removed.insert(path.clone());
        if diags.len() > MAX_DIAGNOSTICS {
            // Each round reads the whole document again: stop once the
            // report is full.
            return (None, diags, removed);
        }
        if path.is_empty() || !doc.remove(&path) {
            return (None, diags, removed);
        }
    }
    (None, diags, removed)
}

fn prune_nulls(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            m.retain(|_, v| !v.is_null());
            m.values_mut().for_each(prune_nulls);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(prune_nulls),
        _ => {}
    }
}

/// serde names Rust types in its messages; say what they mean instead.
fn humanize(message: &str) -> String {
    [
        ("expected u8", "expected a whole number from 0 to 255"),
        ("expected u16", "expected a whole number from 0 to 65535"),
        ("expected u32", "expected a whole number from 0 to 4294967295"),
        ("expected a sequence", "expected a list"),
        ("expected a map", "expected a mapping of keys to values"),
    ]
    .iter()
    .fold(message.to_string(), |m, (from, to)| m.replace(from, to))
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

/// `missing field `x`` → `x`.
fn missing_field(message: &str) -> Option<&str> {
    message.strip_prefix("missing field `")?.split('`').next()
}

/// `unknown field `x`, expected one of `a`, `b`` → (`x`, [a, b]).
fn unknown_field(message: &str) -> Option<(&str, Vec<String>)> {
    let rest = message.strip_prefix("unknown field `")?;
    let (key, tail) = rest.split_once('`')?;
    let expected = tail.split('`').skip(1).step_by(2).map(str::to_string).collect();
    Some((key, expected))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_field_message_is_split() {
        let (k, e) = unknown_field("unknown field `adress`, expected one of `name`, `address`").unwrap();
        assert_eq!(k, "adress");
        assert_eq!(e, ["name", "address"]);
    }
}
