//! Files specd writes (slot saves, benchmark reports) are written whole or not at all: into a
//! temporary file in the target's folder, flushed to disk, then renamed over the target. A crash
//! at any point (SIGKILL, power loss) leaves the old file or the new one, never a mix: a rename
//! within one folder is atomic on POSIX file systems, and the folder is synced so that the rename
//! itself is on disk when the call returns. Writing in place would truncate the old file first.

use std::io::Write;
use std::path::Path;

/// Replaces `path` with `data` atomically. The file is created readable by its owner only (a
/// slot's saved memory holds what its users sent). A temporary file left by a crash is named
/// `.specd-*.tmp`, which no slot file name can be.
pub fn write(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".specd-")
        .suffix(".tmp")
        .tempfile_in(dir)?;
    tmp.write_all(data)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    #[cfg(unix)]
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn replaces_the_file_and_leaves_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("slot.bin");
        std::fs::write(&p, b"old contents, longer").unwrap();
        super::write(&p, b"new").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("slot.bin")]);
        // A folder that does not exist is an error, not a panic.
        assert!(super::write(&dir.path().join("no/such/file"), b"x").is_err());
    }
}
