//! Folder names of the file store: one per pipeline, one per run.
//!
//! A name is percent-encoded (`A-Za-z0-9._-` kept, a leading `.` and every
//! other byte as `%XX`), so no name can leave the root. That can triple a
//! name's length, and file systems take at most 255 bytes per folder name:
//! a name whose encoding is longer gets a bounded folder name instead, its
//! encoding's first characters (whole characters of the name, at most
//! [`PREFIX_BYTES`]), `~`, and 32 hex digits of the SHA-256 of the name.
//! `~` is never part of an encoding, so the two kinds never meet, and
//! every name that fitted keeps the folder it always had. The full name of
//! a hashed folder is the one in the run's `meta.json`.

use sha2::{Digest, Sha256};

/// Longest folder name the store makes (file systems' `NAME_MAX`).
pub(super) const MAX_FOLDER_BYTES: usize = 255;
/// Most bytes of a hashed folder name's readable prefix.
const PREFIX_BYTES: usize = 96;
/// Between a hashed folder name's prefix and its hash.
const HASHED: char = '~';
/// Hex digits of the hash (128 bits).
const HASH_DIGITS: usize = 32;

fn push_encoded(out: &mut String, byte: u8, first: bool) {
    let keep = byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' || (byte == b'.' && !first);
    if keep {
        out.push(byte as char);
    } else {
        out.push_str(&format!("%{byte:02X}"));
    }
}

/// The percent-encoding of `name`.
pub(super) fn encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for (i, byte) in name.bytes().enumerate() {
        push_encoded(&mut out, byte, i == 0);
    }
    out
}

/// The folder of `name`: its encoding, or when that is longer than
/// [`MAX_FOLDER_BYTES`], a readable prefix and a hash.
pub(super) fn folder(name: &str) -> String {
    let plain = encode(name);
    if plain.len() <= MAX_FOLDER_BYTES {
        return plain;
    }
    let mut out = String::with_capacity(PREFIX_BYTES + 1 + HASH_DIGITS);
    let mut piece = String::new();
    for (at, ch) in name.char_indices() {
        piece.clear();
        let mut utf8 = [0u8; 4];
        for (i, byte) in ch.encode_utf8(&mut utf8).bytes().enumerate() {
            push_encoded(&mut piece, byte, at + i == 0);
        }
        if out.len() + piece.len() > PREFIX_BYTES {
            break;
        }
        out.push_str(&piece);
    }
    out.push(HASHED);
    let digest = Sha256::digest(name.as_bytes());
    for byte in &digest[..HASH_DIGITS / 2] {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// Whether a folder name is a hashed one (the name is in the meta).
pub(super) fn is_hashed(folder: &str) -> bool {
    folder.contains(HASHED)
}

/// The name a plain folder name encodes; `None` for a hashed one or one
/// the store did not make.
pub(super) fn decode(folder: &str) -> Option<String> {
    if is_hashed(folder) {
        return None;
    }
    let bytes = folder.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok().filter(|name| encode(name) == folder)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_encoded_reversibly_and_never_escape() {
        for name in ["svc.pipe", ".hidden", "..", "a b/c", "scheduled__2026-08-10T00:00:00", "例", "a~b"] {
            let encoded = folder(name);
            assert_eq!(encoded, encode(name), "a short name keeps its folder");
            assert!(!encoded.starts_with('.') && !encoded.contains('/'), "{encoded}");
            assert_eq!(decode(&encoded).as_deref(), Some(name));
        }
        assert_eq!(decode("a%2"), None);
        assert_eq!(decode("%41"), None, "not what the store would have made of `A`");
    }

    #[test]
    fn long_names_get_bounded_distinct_folders() {
        let cjk = "数据管道".repeat(8);
        let long = [
            "r".repeat(256),
            ":".repeat(256),
            format!(".{}", "x".repeat(255)),
            cjk.clone(),
            format!("{cjk}1"),
            format!("{cjk}2"),
        ];
        let mut seen = std::collections::HashSet::new();
        for name in &long {
            let made = folder(name);
            assert!(made.len() <= MAX_FOLDER_BYTES, "{made}");
            assert!(is_hashed(&made) && decode(&made).is_none(), "{made}");
            assert!(!made.starts_with('.') && !made.contains('/'), "{made}");
            assert!(seen.insert(made.clone()), "{made} twice");
            assert_eq!(made, folder(name), "stable");
        }
        assert!(folder(&cjk).starts_with("%E6%95%B0"), "a readable prefix of whole characters");
        assert_eq!(folder(&"r".repeat(255)), "r".repeat(255), "255 bytes still fit");
    }
}
