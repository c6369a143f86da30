//! sha256 digests as lowercase hex, computed while data streams.

use std::io::{self, Read, Write};

use sha2::{Digest, Sha256};

/// sha256 of a byte slice, as 64 lowercase hex digits.
pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// A reader or writer adapter that hashes what passes through it.
pub struct Hashing<T> {
    inner: T,
    hasher: Sha256,
    count: u64,
}

impl<T> Hashing<T> {
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    /// Bytes seen so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The hex digest of everything seen, and the inner reader or writer.
    pub fn finish(self) -> (String, T) {
        (hex::encode(self.hasher.finalize()), self.inner)
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Whether `s` is 64 lowercase hex digits.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}
