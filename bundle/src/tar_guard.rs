//! The decompressed tar stream, with every header looked at before the tar
//! crate sees it, and a budget on the bytes read.
//!
//! The tar crate reads a GNU long name or long link (`L`, `K`) or a PAX
//! extension (`x`) whole into memory before it hands out the member it
//! describes, whatever size the header claims, and a GNU sparse member (`S`)
//! grows a list with every extension block that follows it. `bundle.yaml`
//! is read in paths that check no signature first (`inspect`, install's
//! validation, the catalog), so a 100 MB header would cost 100 MB of memory
//! before anything else is checked. [`Guarded`] follows the archive's
//! layout as the tar crate does (a 512-byte header, then the entry's data
//! rounded up to 512 bytes) and refuses, at the header:
//!
//! - an extension header (`L`, `K`, `x`, `g`) larger than [`MAX_EXTENSION`];
//! - a sparse member (a bundle holds only regular files);
//! - a PAX extension that sets `size`: the tar crate would then look for the
//!   next header where this reader does not, and the two would disagree
//!   about what is a header (kubexm never writes one).
//!
//! [`Budget`] bounds the whole stream: at first by what a `bundle.yaml` can
//! take, then, once the manifest is read, by what it declares plus a small
//! reserve, so a zstd bomb in a member, in padding or after the last member
//! stops as soon as it passes that.

use std::cell::Cell;
use std::io::{self, Read};

/// The tar block: every header is one, every entry's data is padded to it.
pub const BLOCK: u64 = 512;
/// The largest extension header (long name, long link, PAX record set)
/// accepted. kubexm's own are a path of a few hundred bytes.
pub const MAX_EXTENSION: u64 = 64 * 1024;

/// How many decompressed bytes may be read; shared between the reader and
/// the parser, which raises it once it knows what the archive declares.
pub struct Budget {
    used: Cell<u64>,
    limit: Cell<u64>,
    /// Says what the limit stands for, in the error.
    why: Cell<&'static str>,
}

impl Budget {
    /// A budget of `limit` bytes; `why` names it in the error.
    pub fn new(limit: u64, why: &'static str) -> Budget {
        Budget {
            used: Cell::new(0),
            limit: Cell::new(limit),
            why: Cell::new(why),
        }
    }

    /// From now on, at most `more` bytes past those read so far.
    pub fn allow(&self, more: u64, why: &'static str) {
        self.limit.set(self.used.get().saturating_add(more));
        self.why.set(why);
    }
}

/// The tar stream from `inner`, checked header by header (see the module header).
pub struct Guarded<'b, R> {
    inner: R,
    budget: &'b Budget,
    /// Bytes read ahead to be looked at, not yet handed out.
    held: Vec<u8>,
    held_pos: usize,
    /// Bytes read from `inner`.
    pos: u64,
    /// Where the next header starts.
    next_header: u64,
    /// Past the end-of-archive block (or a truncated header): no more headers.
    ended: bool,
}

impl<'b, R: Read> Guarded<'b, R> {
    pub fn new(inner: R, budget: &'b Budget) -> Self {
        Guarded {
            inner,
            budget,
            held: Vec::new(),
            held_pos: 0,
            pos: 0,
            next_header: 0,
            ended: false,
        }
    }

    /// Reads from `inner` into `buf` as far as it goes, within the budget.
    fn fill(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut filled = 0;
        while filled < buf.len() {
            let room = self.budget.limit.get().saturating_sub(self.budget.used.get());
            if room == 0 {
                return Err(io::Error::other(format!(
                    "the archive holds more than {} ({} bytes); it is damaged or was tampered with",
                    self.budget.why.get(),
                    self.budget.limit.get()
                )));
            }
            let end = buf.len().min(filled.saturating_add(usize::try_from(room).unwrap_or(usize::MAX)));
            match self.inner.read(&mut buf[filled..end]) {
                Ok(0) => break,
                Ok(n) => {
                    filled += n;
                    self.pos += n as u64;
                    self.budget.used.set(self.budget.used.get() + n as u64);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(filled)
    }

    /// Reads the header at `next_header` (and a PAX record set's data) into
    /// `held`, refusing what the module header lists.
    fn inspect(&mut self) -> io::Result<()> {
        let mut header = [0u8; BLOCK as usize];
        let n = self.fill(&mut header)?;
        self.held.clear();
        self.held.extend_from_slice(&header[..n]);
        self.held_pos = 0;
        // The tar crate stops at an all-zero block, and reports a short one.
        if n < header.len() || header.iter().all(|b| *b == 0) {
            self.ended = true;
            return Ok(());
        }
        let kind = header[156];
        let size = entry_size(&header[124..136])?;
        let padded = size
            .checked_next_multiple_of(BLOCK)
            .ok_or_else(|| io::Error::other("a tar header's size overflows"))?;
        self.next_header = self.pos + padded;
        let name = || String::from_utf8_lossy(&header[..100]).trim_end_matches('\0').to_string();
        match kind {
            b'L' | b'K' | b'x' | b'g' if size > MAX_EXTENSION => Err(io::Error::other(format!(
                "an extension header (tar type '{}', before {:?}) of {size} bytes; at most {MAX_EXTENSION} are accepted",
                kind as char,
                name()
            ))),
            b'S' => Err(io::Error::other(format!(
                "member {:?} is a sparse file; a bundle holds only regular files",
                name()
            ))),
            b'x' => {
                let mut data = vec![0u8; padded as usize];
                let got = self.fill(&mut data)?;
                data.truncate(got);
                if data.windows(5).any(|w| w == b"size=") {
                    return Err(io::Error::other(
                        "a PAX extension header sets a member's size; kubexm bundles never do",
                    ));
                }
                self.held.extend_from_slice(&data);
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

impl<R: Read> Read for Guarded<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.held_pos == self.held.len() && !self.ended && self.pos == self.next_header {
            self.inspect()?;
        }
        if self.held_pos < self.held.len() {
            let n = buf.len().min(self.held.len() - self.held_pos);
            buf[..n].copy_from_slice(&self.held[self.held_pos..self.held_pos + n]);
            self.held_pos += n;
            return Ok(n);
        }
        // Entry data: never past the next header, so it is read on its own.
        let mut want = buf.len();
        if !self.ended {
            want = want.min(usize::try_from(self.next_header - self.pos).unwrap_or(usize::MAX));
        }
        self.fill(&mut buf[..want])
    }
}

/// A header's size field, read as the tar crate reads it (octal text, or
/// base-256 when the high bit of the first byte is set).
fn entry_size(field: &[u8]) -> io::Result<u64> {
    if field[0] & 0x80 != 0 {
        // The last 8 bytes, as the tar crate does for a 12-byte field.
        return Ok(field[field.len() - 8..].iter().fold(0u64, |n, b| (n << 8) | u64::from(*b)));
    }
    let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
    std::str::from_utf8(&field[..end])
        .ok()
        .and_then(|s| u64::from_str_radix(s.trim(), 8).ok())
        .ok_or_else(|| io::Error::other("a tar header's size field is not a number"))
}

#[cfg(test)]
mod tests {
    use super::*;

    // The parser reads members only as far as their declared sizes, so the
    // budget is a second line: it must stop a stream that runs past it.
    #[test]
    fn the_stream_stops_at_its_budget() {
        let mut tar = crate::testing::header_block("x", 10 << 20, tar::EntryType::Regular).to_vec();
        tar.resize(tar.len() + (10 << 20), 0);
        let budget = Budget::new(1 << 20, "what the test allows");
        let err = io::copy(&mut Guarded::new(&tar[..], &budget), &mut io::sink()).unwrap_err();
        assert!(err.to_string().contains("more than what the test allows (1048576 bytes)"), "{err}");
        assert_eq!(budget.used.get(), 1 << 20);
    }

    #[test]
    fn sizes_read_as_the_tar_crate_reads_them() -> io::Result<()> {
        for size in [0u64, 1, 511, 512, 8 << 30, 1 << 40] {
            let mut h = tar::Header::new_gnu();
            h.set_size(size);
            assert_eq!(entry_size(&h.as_bytes()[124..136])?, h.entry_size()?, "{size}");
        }
        Ok(())
    }
}
