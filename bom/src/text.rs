//! Text that came from a request, a Cluster object or a host, made safe to store and show.
//! PostgreSQL cannot store a NUL; a terminal obeys escape sequences, and a
//! `\r` rewrites the line it is on. Every such character becomes a visible
//! `\u{..}` escape before the text reaches the job database, and so before
//! it reaches anyone's terminal or log stream.

use std::borrow::Cow;

/// `s` with every control character except tab (and, with `newlines`,
/// line feed) written as a visible `\u{..}` escape.
pub fn clean(s: &str, newlines: bool) -> Cow<'_, str> {
    let bad = |c: char| c.is_control() && c != '\t' && !(newlines && c == '\n');
    if !s.chars().any(bad) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if bad(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// One log line: no control character at all (a line feed is escaped too,
/// so one stored line is one shown line).
pub fn line(s: &str) -> Cow<'_, str> {
    clean(s, false)
}

/// A multi-line text (a job's error): line feeds kept, the rest escaped.
pub fn block(s: &str) -> Cow<'_, str> {
    clean(s, true)
}

/// `s` percent-encoded: every byte but ASCII letters, digits and those in
/// `keep` written as `%XX` (a URL's query value, a package URL's part).
pub fn percent(s: &str, keep: &[u8]) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || keep.contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_escape_sequences_and_carriage_returns_become_visible() {
        assert_eq!(line("X\0Y"), "X\\u{0}Y");
        assert_eq!(line("a\x1b[2Jb\rc\nd"), "a\\u{1b}[2Jb\\u{d}c\\u{a}d");
        assert_eq!(block("a\nb\x07"), "a\nb\\u{7}");
        assert!(matches!(line("plain\ttext"), Cow::Borrowed(_)));
        assert_eq!(line("\u{9b}31m"), "\\u{9b}31m");
    }
}
