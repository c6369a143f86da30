//! Writing files whole or not at all, for every binary that writes one a
//! user will read (keys, signatures, example configs, timelines).

use std::io::Write;
use std::path::Path;

/// Writes `bytes` to `path` whole or not at all: a temporary file beside
/// it, synced, then renamed over it; the temporary file is removed on
/// failure. Errors name the file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{} has no file name", path.display())))?
        .to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = fs_err::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs_err::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs_err::remove_file(&tmp);
    }
    result
}
