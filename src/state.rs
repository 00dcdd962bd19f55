//! The rules every state write follows: hold `state.lock`, write to a temp
//! file in the same directory, fsync, rename. Also the readers that turn a
//! malformed file into an error naming the file and line.
//!
//! Callers never open state files for writing themselves; they go through
//! [`write_atomic`] so a crash or a full disk cannot leave a half-written file.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Exclusive hold on `state.lock`. Released on drop.
#[derive(Debug)]
pub struct Lock {
    file: File,
    path: PathBuf,
}

impl Lock {
    /// Block until the lock at `path` is held. Creates the file (0600) and its
    /// directory (0700) if needed.
    pub fn acquire(path: &Path) -> Result<Self> {
        let file = open_lock_file(path)?;
        // fs4 rather than std's inherent `File::lock`: it keeps flock(2)
        // semantics explicit, and fully qualified to avoid the std method.
        fs4::FileExt::lock(&file).with_context(|| format!("could not lock `{}`", path.display()))?;
        Ok(Self { file, path: path.to_owned() })
    }

    /// Take the lock at `path` if nobody holds it; `None` when someone does.
    pub fn try_acquire(path: &Path) -> Result<Option<Self>> {
        let file = open_lock_file(path)?;
        match fs4::FileExt::try_lock(&file) {
            Ok(()) => Ok(Some(Self { file, path: path.to_owned() })),
            Err(fs4::TryLockError::WouldBlock) => Ok(None),
            Err(fs4::TryLockError::Error(e)) => Err(e).with_context(|| format!("could not lock `{}`", path.display())),
        }
    }

    /// Whether some process holds the lock at `path` now. Never blocks and
    /// never creates the file.
    pub fn is_held(path: &Path) -> Result<bool> {
        let file = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e).with_context(|| format!("could not open `{}`", path.display())),
        };
        match fs4::FileExt::try_lock_shared(&file) {
            Ok(()) => {
                let _ = fs4::FileExt::unlock(&file);
                Ok(false)
            }
            Err(fs4::TryLockError::WouldBlock) => Ok(true),
            Err(fs4::TryLockError::Error(e)) => Err(e).with_context(|| format!("could not check `{}`", path.display())),
        }
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        let _ = fs4::FileExt::unlock(&self.file);
    }
}

/// Open (creating 0600, in a 0700 directory) the file a lock lives on.
fn open_lock_file(path: &Path) -> Result<File> {
    if let Some(dir) = path.parent() {
        create_private_dir(dir)?;
    }
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("could not open lock file `{}`", path.display()))
}

/// Create `dir` and missing parents with mode 0700. An existing directory is
/// left as it is.
pub fn create_private_dir(dir: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("could not create directory `{}`", dir.display()))
}

/// Make `dir` (created if missing) accessible to its owner only. Used for
/// directories that hold secret material: a root the user created 0755
/// before ppp ran would otherwise expose file names and allow listing.
pub fn tighten_dir(dir: &Path) -> Result<()> {
    create_private_dir(dir)?;
    let meta = std::fs::metadata(dir).with_context(|| format!("could not inspect `{}`", dir.display()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("could not make `{}` private (mode 0700)", dir.display()))?;
    }
    Ok(())
}

/// Replace `path` with `bytes` atomically: temp file in the same directory,
/// fsync, rename, fsync the directory. The file gets `mode`; a missing
/// directory is created private (0700), as for all of ppp's state.
pub fn write_atomic_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let dir = path.parent().ok_or_else(|| anyhow!("`{}` has no parent directory", path.display()))?;
    create_private_dir(dir)?;
    replace_file(path, bytes, mode)
}

/// [`write_atomic_mode`] for a file the user named (`kit pack -o`, `kit
/// pull -o`): the same atomic replace, but its directory must exist and
/// is left as it is, and a bare file name means the current directory.
pub fn replace_file(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .permissions(std::fs::Permissions::from_mode(mode))
        .tempfile_in(dir)
        .with_context(|| format!("could not create a temp file in `{}`", dir.display()))?;
    tmp.write_all(bytes)
        .and_then(|()| tmp.as_file().sync_all())
        .with_context(|| format!("could not write `{}`", tmp.path().display()))?;
    tmp.persist(path).map_err(|e| e.error).with_context(|| format!("could not replace `{}`", path.display()))?;
    // The rename is durable only once the directory entry is.
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("could not sync directory `{}`", dir.display()))?;
    Ok(())
}

/// Move a file another program wrote (`qemu-img`, `tar`) to `dst`
/// durably: fsync its data, rename it over `dst`, fsync the directory. A
/// crash leaves either the old `dst` or the whole new file, never a
/// truncated one that an index already lists.
pub fn persist_file(staged: &Path, dst: &Path) -> Result<()> {
    File::open(staged).and_then(|f| f.sync_all()).with_context(|| format!("could not sync `{}`", staged.display()))?;
    std::fs::rename(staged, dst)
        .with_context(|| format!("could not move `{}` to `{}`", staged.display(), dst.display()))?;
    let dir = dst.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    File::open(dir).and_then(|d| d.sync_all()).with_context(|| format!("could not sync directory `{}`", dir.display()))
}

/// [`write_atomic_mode`] with mode 0600: state files are private by default.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_mode(path, bytes, 0o600)
}

/// Serialize `value` as pretty JSON and write it atomically.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(value)?;
    bytes.push(b'\n');
    write_atomic(path, &bytes)
}

/// Serialize `value` as YAML and write it atomically.
pub fn write_yaml<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = serde_norway::to_string(value)?;
    write_atomic(path, text.as_bytes())
}

/// Read a file, `None` when it does not exist.
pub fn read_optional(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("could not read `{}`", path.display())),
    }
}

/// A state file that exists but does not parse. Its message names the file
/// and line, which is what a user needs to fix it by hand.
#[derive(Debug, thiserror::Error)]
#[error("`{path}` line {line}, column {column}: {message}", path = path.display())]
pub struct ParseError {
    pub path: PathBuf,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// Parse JSON text read from `path`.
pub fn parse_json<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T, ParseError> {
    serde_json::from_str(text).map_err(|e| ParseError {
        path: path.to_owned(),
        line: e.line(),
        column: e.column(),
        message: strip_location(&e.to_string()),
    })
}

/// Parse YAML text read from `path`.
pub fn parse_yaml<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T, ParseError> {
    serde_norway::from_str(text).map_err(|e| {
        let (line, column) = e.location().map_or((1, 1), |l| (l.line(), l.column()));
        ParseError { path: path.to_owned(), line, column, message: strip_location(&e.to_string()) }
    })
}

/// serde's messages end in " at line L column C"; we print the location
/// ourselves, in front, so drop the duplicate.
pub(crate) fn strip_location(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_owned(),
        None => msg.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_sets_mode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/x.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "two");
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(p.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);
        // No temp files are left behind.
        assert_eq!(std::fs::read_dir(p.parent().unwrap()).unwrap().count(), 1);
    }

    #[test]
    fn parse_errors_name_file_and_line() {
        let p = Path::new("/x/policies.yaml");
        let err = parse_yaml::<serde_json::Value>(p, "a: 1\nb: [\n").unwrap_err();
        assert_eq!(err.path, p);
        assert!(err.line >= 2, "{err}");
        let err = parse_json::<serde_json::Value>(Path::new("/x/s.json"), "{\n\"a\": ,}").unwrap_err();
        assert_eq!(err.line, 2);
        assert!(err.to_string().starts_with("`/x/s.json` line 2"), "{err}");
    }
}
