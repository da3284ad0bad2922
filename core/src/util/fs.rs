//! File helpers.
use crate::error::{Error, Result};
use std::path::Path;

pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    // A name of its own per process and call: two writers of one file never share a half file.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".partial-{}-{n}", std::process::id()));
    let tmp = path.with_file_name(name);
    if let Err(e) = std::fs::write(&tmp, bytes) {
        // A full disk must not leave hundreds of MB behind that block the next attempt.
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(&tmp, e));
    }
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path, e)
    })
}

/// Checks that `path` is a regular file (after links) before it is opened: a FIFO or a device
/// named like a model file would block a read forever or never end.
pub fn check_regular_file(path: &Path) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(Error::format(path, "not a regular file (a directory, FIFO or device cannot be read as one)"));
    }
    Ok(())
}

/// A regular file's bytes (see `check_regular_file`).
pub fn read_file(path: &Path) -> Result<Vec<u8>> {
    check_regular_file(path)?;
    std::fs::read(path).map_err(|e| Error::io(path, e))
}

/// A regular file's UTF-8 text (see `check_regular_file`).
pub fn read_text(path: &Path) -> Result<String> {
    String::from_utf8(read_file(path)?).map_err(|_| Error::format(path, "not UTF-8 text"))
}

/// SHA-256 of `bytes` in lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}
