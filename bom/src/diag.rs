//! Diagnostics: one problem in a config, with where it is and what to do.

use std::fmt;

use serde::Serialize;

use crate::yaml::Pos;

/// What class of problem a diagnostic reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Not YAML, or over a parser budget.
    Syntax,
    /// A key the model does not have, or a value of the wrong type.
    Schema,
    /// Well-formed but wrong: the rules an operator would check.
    Invalid,
    /// Known to the model, not implemented by this release.
    Unsupported,
}

/// One problem, located by YAML path and, where known, line and column.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    pub kind: Kind,
    /// YAML path (`spec.hosts[1].address`); empty for the whole document.
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<u32>,
    pub message: String,
    /// What to do about it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl Diagnostic {
    pub fn new(kind: Kind, path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            kind,
            path: path.into(),
            line: None,
            column: None,
            message: message.into(),
            hint: None,
        }
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    pub fn at(mut self, pos: Option<Pos>) -> Self {
        if let Some(p) = pos {
            self.line = Some(p.line);
            self.column = Some(p.column);
        }
        self
    }
}

/// At most this many problems are reported for one file; the rest are
/// counted, never built (a hostile file of 100,000 empty hosts would
/// otherwise answer with hundreds of megabytes of errors).
pub const MAX_DIAGNOSTICS: usize = 100;

/// Every problem found in one file, in document order: the first
/// [`MAX_DIAGNOSTICS`], and how many more there are.
#[derive(Debug, Clone, Serialize, thiserror::Error)]
pub struct Diagnostics {
    pub file: String,
    pub diagnostics: Vec<Diagnostic>,
    /// Problems found past [`MAX_DIAGNOSTICS`], not listed.
    #[serde(skip_serializing_if = "is_zero")]
    pub more: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.diagnostics.len() + self.more;
        writeln!(f, "{}: {n} problem{}", self.file, if n == 1 { "" } else { "s" })?;
        for d in &self.diagnostics {
            write!(f, "{}", self.file)?;
            if let (Some(l), Some(c)) = (d.line, d.column) {
                write!(f, ":{l}:{c}")?;
            }
            let path = if d.path.is_empty() {
                String::new()
            } else {
                format!(" {}:", d.path)
            };
            writeln!(f, ":{path} {}", d.message)?;
            if let Some(h) = &d.hint {
                writeln!(f, "    hint: {h}")?;
            }
        }
        if self.more > 0 {
            writeln!(f, "{}: and {} more (fix these first)", self.file, self.more)?;
        }
        Ok(())
    }
}

/// The closest of `candidates` to `word`, if it is close enough to be a typo.
pub fn did_you_mean<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(&word.to_lowercase(), &c.to_lowercase()), c))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

/// An error with its causes (`refused: connection refused`): HTTP and registry
/// clients keep the useful part in the source chain.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(cause) = cur {
        let text = cause.to_string();
        // Some errors already repeat their cause in their own message.
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = cause.source();
    }
    s
}
