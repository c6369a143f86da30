//! The content-addressed cache shared by builds.
//!
//! `blobs/sha256/<hex>` holds verified content only: a file lands there by
//! rename after its digest checked out, so a crash never leaves a bad blob.
//! `refs/<kind>/<key>` remembers what a mutable name (a tag, a checksum URL,
//! a chart repository entry) resolved to, so a second build with nothing
//! changed asks no upstream anything. `tmp/` holds partial downloads, which a
//! later fetch of the same URL resumes.

use std::path::{Path, PathBuf};

use serde::{Serialize, de::DeserializeOwned};

use kubexm_bundle::digest::sha256_hex;

#[derive(Debug, Clone)]
pub struct Cache {
    root: PathBuf,
}

impl Cache {
    pub fn open(root: &Path) -> std::io::Result<Cache> {
        for d in ["blobs/sha256", "refs", "tmp"] {
            fs_err::create_dir_all(root.join(d))?;
        }
        Ok(Cache { root: root.to_path_buf() })
    }

    /// The default cache directory: `$XDG_CACHE_HOME/kubexm` or `~/.cache/kubexm`.
    pub fn default_dir() -> PathBuf {
        if let Some(x) = std::env::var_os("XDG_CACHE_HOME") {
            return PathBuf::from(x).join("kubexm");
        }
        match std::env::var_os("HOME") {
            Some(h) => PathBuf::from(h).join(".cache/kubexm"),
            None => PathBuf::from("/var/cache/kubexm"),
        }
    }

    pub fn blob(&self, hex: &str) -> PathBuf {
        self.root.join("blobs/sha256").join(hex)
    }

    pub fn has(&self, hex: &str) -> bool {
        self.blob(hex).is_file()
    }

    /// A partial-download path for a key (a URL or a blob digest).
    pub fn partial(&self, key: &str) -> PathBuf {
        self.root.join("tmp").join(format!("{}.part", &sha256_hex(key.as_bytes())[..32]))
    }

    /// Moves a verified temporary file into the store.
    pub fn commit(&self, tmp: &Path, hex: &str) -> std::io::Result<PathBuf> {
        let dest = self.blob(hex);
        fs_err::rename(tmp, &dest)?;
        Ok(dest)
    }

    /// Stores verified bytes.
    pub fn put_bytes(&self, bytes: &[u8]) -> std::io::Result<String> {
        let hex = sha256_hex(bytes);
        if !self.has(&hex) {
            let tmp = self.root.join("tmp").join(format!("{hex}.{}.new", std::process::id()));
            fs_err::write(&tmp, bytes)?;
            self.commit(&tmp, &hex)?;
        }
        Ok(hex)
    }

    pub fn read(&self, hex: &str) -> std::io::Result<Vec<u8>> {
        fs_err::read(self.blob(hex))
    }

    fn ref_path(&self, kind: &str, key: &str) -> PathBuf {
        self.root.join("refs").join(kind).join(sha256_hex(key.as_bytes()))
    }

    /// What `key` resolved to last time, if recorded.
    pub fn get_ref<T: DeserializeOwned>(&self, kind: &str, key: &str) -> Option<T> {
        let text = fs_err::read(self.ref_path(kind, key)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Records what `key` resolved to (written whole, then renamed).
    pub fn set_ref<T: Serialize>(&self, kind: &str, key: &str, value: &T) -> std::io::Result<()> {
        let path = self.ref_path(kind, key);
        if let Some(dir) = path.parent() {
            fs_err::create_dir_all(dir)?;
        }
        // Unique per writer: two tasks of one build may record the same key at once.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = path.with_extension(format!("tmp-{}-{n}", std::process::id()));
        fs_err::write(&tmp, serde_json::to_vec(value).map_err(std::io::Error::other)?)?;
        fs_err::rename(&tmp, &path)
    }
}
