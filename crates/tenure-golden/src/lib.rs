//! Golden files for tenure's format tests (issue 19, item 10): each pinned value is encoded and
//! compared byte for byte with a committed `NAME.hex` file, the committed bytes are decoded and
//! encoded again to themselves, and a committed file that no value checks fails the test (a
//! removed or renamed kind must be removed deliberately). `TENURE_BLESS=1` writes the files
//! instead of comparing:
//!
//! ```text
//! TENURE_BLESS=1 cargo test --workspace --all-features -- golden
//! ```
//!
//! Used by the golden tests of `tenure-proto` and `tenure-storage` and by `tenure-transport`'s
//! payload test, as a dev-dependency only.
//!
//! Must not depend on: any tenure crate (it knows bytes and postcard, not what they encode).

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Compares and (with `TENURE_BLESS=1`) writes the golden files of one directory. Collects
/// every mismatch; [`Golden::finish`] fails with all of them at once.
pub struct Golden {
    dir: PathBuf,
    bless: bool,
    seen: BTreeSet<String>,
    failures: Vec<String>,
}

impl Golden {
    /// The golden files under `dir` (created when blessing).
    ///
    /// # Panics
    /// When blessing and `dir` cannot be created (a test helper: the test fails).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        let bless = std::env::var("TENURE_BLESS").is_ok_and(|v| v == "1");
        if bless {
            if let Err(error) = std::fs::create_dir_all(&dir) {
                panic!("creating {}: {error}", dir.display());
            }
        }
        Golden {
            dir,
            bless,
            seen: BTreeSet::new(),
            failures: Vec::new(),
        }
    }

    /// Checks `bytes` against `NAME.hex`; returns the committed bytes (or `bytes` when
    /// blessing, or when the file is missing, which is recorded as a failure).
    ///
    /// # Panics
    /// When `name` was checked before, or when blessing cannot write the file.
    pub fn bytes(&mut self, name: &str, bytes: &[u8]) -> Vec<u8> {
        assert!(self.seen.insert(name.to_owned()), "golden {name} twice");
        let path = self.dir.join(format!("{name}.hex"));
        if self.bless {
            if let Err(error) = std::fs::write(&path, to_hex(bytes)) {
                panic!("writing {}: {error}", path.display());
            }
            return bytes.to_vec();
        }
        let committed = match read_hex_file(&path) {
            Ok(committed) => committed,
            Err(error) => {
                self.failures.push(format!("{name}: {error}"));
                return bytes.to_vec();
            }
        };
        if committed != bytes {
            self.failures.push(format!(
                "{name}: encoding changed\n  committed {}\n  now       {}",
                to_hex(&committed).replace('\n', ""),
                to_hex(bytes).replace('\n', "")
            ));
        }
        committed
    }

    /// The committed bytes of `NAME.hex` written by an older format version that this build
    /// must still read: never compared with a new encoding and never rewritten when blessing
    /// (the caller checks that they decode to what they should). A missing file is a failure.
    ///
    /// # Panics
    /// When `name` was checked before.
    pub fn legacy(&mut self, name: &str) -> Vec<u8> {
        assert!(self.seen.insert(name.to_owned()), "golden {name} twice");
        let path = self.dir.join(format!("{name}.hex"));
        match read_hex_file(&path) {
            Ok(committed) => committed,
            Err(error) => {
                self.failures
                    .push(format!("{name} (legacy, never re-blessed): {error}"));
                Vec::new()
            }
        }
    }

    /// [`Golden::postcard`] for a type with `PartialEq`.
    pub fn value<T: Serialize + DeserializeOwned + PartialEq + Debug>(
        &mut self,
        name: &str,
        value: &T,
    ) {
        self.postcard(name, value, PartialEq::eq);
    }

    /// Checks a bare postcard value: its bytes; that the committed bytes decode to a value
    /// `same` as it; that they encode back to themselves.
    pub fn postcard<T: Serialize + DeserializeOwned + Debug>(
        &mut self,
        name: &str,
        value: &T,
        same: impl Fn(&T, &T) -> bool,
    ) {
        let bytes = match postcard::to_allocvec(value) {
            Ok(bytes) => bytes,
            Err(error) => {
                self.failures
                    .push(format!("{name}: {value:?} does not encode: {error}"));
                return;
            }
        };
        let committed = self.bytes(name, &bytes);
        self.decodes_back(
            name,
            value,
            &committed,
            |bytes| postcard::from_bytes::<T>(bytes),
            |value| postcard::to_allocvec(value).map_err(|error| error.to_string()),
            same,
        );
    }

    /// Checks that `committed` decodes (with `decode`) to a value `same` as `value` and encodes
    /// back (with `encode`) to the same bytes: for formats that wrap postcard (a checksum and a
    /// version in front).
    pub fn decodes_back<T: Debug, E: std::fmt::Display>(
        &mut self,
        name: &str,
        value: &T,
        committed: &[u8],
        decode: impl Fn(&[u8]) -> Result<T, E>,
        encode: impl Fn(&T) -> Result<Vec<u8>, String>,
        same: impl Fn(&T, &T) -> bool,
    ) {
        match decode(committed) {
            Ok(decoded) => {
                if !same(&decoded, value) {
                    self.failures.push(format!(
                        "{name}: the committed bytes decode to {decoded:?}, expected {value:?}"
                    ));
                }
                match encode(&decoded) {
                    Ok(again) if again == committed => {}
                    Ok(_) => self.failures.push(format!(
                        "{name}: decoding and re-encoding changed the bytes"
                    )),
                    Err(error) => self.failures.push(format!(
                        "{name}: the decoded value does not encode: {error}"
                    )),
                }
            }
            Err(error) => self.failures.push(format!(
                "{name}: the committed bytes no longer decode: {error}"
            )),
        }
    }

    /// Records a failure found by the caller's own check.
    pub fn failure(&mut self, text: String) {
        self.failures.push(text);
    }

    /// Fails with every mismatch, and with every committed file no value checked; `what`
    /// names the formats in the message (`"a wire format"`), `advice` says what to bump.
    ///
    /// # Panics
    /// On any failure: that is the test failing.
    pub fn finish(self, what: &str, advice: &str) {
        let mut failures = self.failures;
        if !self.bless {
            let files: BTreeSet<String> = std::fs::read_dir(&self.dir)
                .map(|entries| {
                    entries
                        .filter_map(|entry| entry.ok())
                        .filter_map(|entry| {
                            entry
                                .file_name()
                                .to_str()
                                .and_then(|name| name.strip_suffix(".hex"))
                                .map(str::to_owned)
                        })
                        .collect()
                })
                .unwrap_or_default();
            for orphan in files.difference(&self.seen) {
                failures.push(format!(
                    "{orphan}.hex in {} is checked by nothing",
                    self.dir.display()
                ));
            }
        }
        assert!(
            failures.is_empty(),
            "{} golden mismatch(es) in {}: {what} changed. If deliberate, {advice} and re-bless \
             with `TENURE_BLESS=1 cargo test --workspace --all-features -- golden`.\n{}",
            failures.len(),
            self.dir.display(),
            failures.join("\n")
        );
    }
}

/// `bytes` as lower-case hex, 32 bytes per line.
pub fn to_hex(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len() * 2 + bytes.len() / 32 + 1);
    for line in bytes.chunks(32) {
        for byte in line {
            text.push_str(&format!("{byte:02x}"));
        }
        text.push('\n');
    }
    text
}

/// The bytes of hex text; anything but hex digits (line breaks) is skipped. `None` for an odd
/// number of digits.
pub fn from_hex(text: &str) -> Option<Vec<u8>> {
    let digits: Vec<u8> = text
        .bytes()
        .filter(u8::is_ascii_hexdigit)
        .map(|digit| match digit {
            b'0'..=b'9' => digit - b'0',
            b'a'..=b'f' => digit - b'a' + 10,
            _ => digit - b'A' + 10,
        })
        .collect();
    if digits.len() % 2 != 0 {
        return None;
    }
    Some(
        digits
            .chunks(2)
            .map(|pair| pair[0] << 4 | pair[1])
            .collect(),
    )
}

/// The bytes of a committed golden file, or why they cannot be had.
pub fn read_hex_file(path: &Path) -> Result<Vec<u8>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("no golden file {} ({error})", path.display()))?;
    from_hex(&text).ok_or_else(|| format!("{}: an odd number of hex digits", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_odd_digits() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(from_hex(&to_hex(&bytes)), Some(bytes));
        assert_eq!(from_hex("0A ff\n1"), None);
        assert_eq!(from_hex("0A ff\n"), Some(vec![0x0a, 0xff]));
    }
}
