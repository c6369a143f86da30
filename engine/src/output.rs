//! What a host prints, bounded. A host may print gigabytes (a broken
//! program, a hostile one), and one worker runs the jobs of many clusters:
//! a command's output is kept as its first and last bytes with the count of
//! what was dropped between them said in the text, and reading stops at a
//! hard ceiling (the SSH transport then closes the channel), so neither the
//! worker's memory nor the logs stored from it grow with what a host sends.
//!
//! Every transport, every stored step log and every log line the engine
//! emits goes through this module: one piece of code decides what is kept.

use std::borrow::Cow;
use std::collections::VecDeque;

/// Bytes kept of one stream of one command (its first half and last half).
pub const KEEP: usize = 1 << 20;

/// Bytes read of one command (both streams) after which its channel is
/// closed and the command reported failed: reading on would only burn the
/// step's time (up to its timeout) on output that is dropped anyway.
pub const READ_CEILING: u64 = 64 << 20;

/// Lines of one step's log sent as log lines (its first and last half); the
/// whole (bounded) log is in the state database.
pub const EVENT_LINES: usize = 400;

/// One stream of output as it arrives: its head, a ring of its tail, and
/// how much went by.
#[derive(Debug)]
pub struct Capture {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    head_cap: usize,
    tail_cap: usize,
    seen: u64,
}

impl Default for Capture {
    fn default() -> Capture {
        Capture::new(KEEP)
    }
}

impl Capture {
    /// A capture keeping at most `keep` bytes (about half head, half tail).
    pub fn new(keep: usize) -> Capture {
        let head_cap = keep / 2;
        Capture {
            head: Vec::new(),
            tail: VecDeque::new(),
            head_cap,
            tail_cap: keep - head_cap,
            seen: 0,
        }
    }

    /// Takes the next bytes of the stream.
    pub fn push(&mut self, data: &[u8]) {
        self.seen += data.len() as u64;
        let n = self.head_cap.saturating_sub(self.head.len()).min(data.len());
        self.head.extend_from_slice(&data[..n]);
        let rest = &data[n..];
        if rest.len() >= self.tail_cap {
            self.tail.clear();
            self.tail.extend(&rest[rest.len() - self.tail_cap..]);
        } else {
            self.tail.extend(rest);
            let excess = self.tail.len().saturating_sub(self.tail_cap);
            self.tail.drain(..excess);
        }
    }

    /// Bytes that went by, kept or not.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// The kept text: the head, a line saying how many bytes were dropped
    /// (when any were), and the tail; never a character cut in two.
    pub fn finish(self) -> String {
        let tail: Vec<u8> = self.tail.into();
        let kept = (self.head.len() + tail.len()) as u64;
        if kept == self.seen {
            let mut all = self.head;
            all.extend_from_slice(&tail);
            return String::from_utf8_lossy(&all).into_owned();
        }
        // The cuts may fall inside a character: its pieces are dropped too.
        let head_end = complete_end(&self.head);
        let tail_start = tail.iter().take(3).take_while(|b| is_continuation(**b)).count();
        let dropped = self.seen - (head_end + tail.len() - tail_start) as u64;
        let mut out = String::from_utf8_lossy(&self.head[..head_end]).into_owned();
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&format!("[kubexm: {dropped} bytes of output dropped]\n"));
        out.push_str(&String::from_utf8_lossy(&tail[tail_start..]));
        out
    }
}

fn is_continuation(b: u8) -> bool {
    b & 0xC0 == 0x80
}

/// Where `b` ends without a trailing incomplete UTF-8 character.
fn complete_end(b: &[u8]) -> usize {
    let n = b.len();
    for back in 1..=n.min(4) {
        let c = b[n - back];
        if !is_continuation(c) {
            let need = match c {
                // Not a lead byte at all: nothing to complete.
                0xF8.. => 1,
                0xF0.. => 4,
                0xE0.. => 3,
                0xC0.. => 2,
                _ => 1,
            };
            return if need > back { n - back } else { n };
        }
    }
    n
}

/// `text` bounded to about `keep` bytes, head and tail, saying what was dropped.
pub fn bound(text: &str, keep: usize) -> Cow<'_, str> {
    if text.len() <= keep {
        return Cow::Borrowed(text);
    }
    let mut c = Capture::new(keep);
    c.push(text.as_bytes());
    Cow::Owned(c.finish())
}

/// The lines of `text`: the first and last `keep / 2`, with a line saying
/// how many between them were dropped.
pub fn bound_lines(text: &str, keep: usize) -> Vec<Cow<'_, str>> {
    let total = text.lines().count();
    if total <= keep {
        return text.lines().map(Cow::Borrowed).collect();
    }
    let head = keep / 2;
    let tail = keep - head;
    let mut out: Vec<Cow<str>> = text.lines().take(head).map(Cow::Borrowed).collect();
    out.push(Cow::Owned(format!("[kubexm: {} lines of this log dropped]", total - keep)));
    out.extend(text.lines().skip(total - tail).map(Cow::Borrowed));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The count a dropped-bytes line says; 0 without one.
    fn dropped(s: &str) -> u64 {
        s.find("[kubexm: ")
            .and_then(|at| s[at + 9..].split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    #[test]
    fn short_output_is_kept_whole() {
        let mut c = Capture::new(100);
        c.push(b"hello ");
        c.push(b"world");
        assert_eq!(c.finish(), "hello world");
        assert!(matches!(bound("abc", 3), Cow::Borrowed("abc")));
    }

    #[test]
    fn head_and_tail_are_kept_and_the_dropped_bytes_counted() -> Result<(), Box<dyn std::error::Error>> {
        let mut c = Capture::new(20);
        // 1000 bytes in chunks of every size: the head is the first 10, the tail the last 10.
        let all: Vec<u8> = (0..1000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let mut at = 0;
        for size in (1..).cycle() {
            if at >= all.len() {
                break;
            }
            let end = (at + size).min(all.len());
            c.push(&all[at..end]);
            at = end;
        }
        assert_eq!(c.seen(), 1000);
        let out = c.finish();
        let text = String::from_utf8(all)?;
        assert_eq!(
            out,
            format!("{}\n[kubexm: 980 bytes of output dropped]\n{}", &text[..10], &text[990..])
        );
        Ok(())
    }

    #[test]
    fn a_chunk_larger_than_the_tail_replaces_it() {
        let mut c = Capture::new(8);
        c.push(b"0123");
        c.push(b"abcdefghij");
        c.push(b"XY");
        assert_eq!(c.finish(), "0123\n[kubexm: 8 bytes of output dropped]\nijXY");
    }

    #[test]
    fn utf8_characters_are_never_cut_in_two() -> Result<(), Box<dyn std::error::Error>> {
        // 1-, 2-, 3- and 4-byte characters, so the cuts fall at every offset within one.
        let text: String = "aé€😀".repeat(500);
        for keep in 10..40 {
            let out = bound(&text, keep);
            assert!(!out.contains('\u{FFFD}'), "keep {keep}: {out}");
            let marker = out.lines().find(|l| l.starts_with("[kubexm")).ok_or("no dropped-bytes line")?;
            let kept = out.len() - marker.len() - 2;
            assert_eq!(kept as u64 + dropped(&out), text.len() as u64, "keep {keep}: {out}");
            assert!(out.len() <= keep + 60, "keep {keep}: {} bytes", out.len());
        }
        Ok(())
    }

    #[test]
    fn binary_output_is_bounded_too() {
        let mut c = Capture::new(KEEP);
        let chunk = vec![0xFFu8; 1 << 16];
        for _ in 0..100 {
            c.push(&chunk);
        }
        let out = c.finish();
        assert_eq!(dropped(&out), 100 * (1 << 16) - KEEP as u64);
        // Each invalid byte is one replacement character (3 bytes).
        assert!(out.len() < 3 * KEEP + 100);
    }

    #[test]
    fn lines_are_bounded_with_the_count_said() {
        let text: String = (0..10).map(|i| format!("l{i}\n")).collect();
        assert_eq!(bound_lines(&text, 10).len(), 10);
        assert_eq!(
            bound_lines(&text, 4),
            ["l0", "l1", "[kubexm: 6 lines of this log dropped]", "l8", "l9"]
        );
    }
}
