//! A minisign signature's trusted comment, authenticated on its own before
//! the bundle is read.
//!
//! A minisign signature is two Ed25519 signatures: one over the file's
//! BLAKE2b hash, known only when the last byte has been read, and a global
//! one over that signature and the trusted comment, checkable at once. The
//! builder names `bundle.yaml`'s sha256 in the trusted comment, and
//! `bundle.yaml` lists every member's size and sha256; so once the comment
//! is authenticated, a `bundle.yaml` that is not the one signed is refused
//! before a member is written, and nothing the members declare is a lie.
//! `minisign-verify` checks the global signature only together with the
//! file's, hence this module.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::manifest::MANIFEST_NAME;

/// The trusted comment of the signature `sig_text`, once its global
/// signature checked out with the public key `pk_text` (a minisign public
/// key file or its base64 line).
pub fn authenticate(pk_text: &str, sig_text: &str) -> Result<String, String> {
    let pk_line = pk_text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("untrusted comment:"))
        .ok_or("no key in the public key file")?;
    let pk = decode(pk_line, 42, "the public key")?;
    let mut lines = sig_text.lines().skip(1);
    let sig = decode(lines.next().unwrap_or_default().trim(), 74, "the signature")?;
    let comment = lines
        .next()
        .and_then(|l| l.strip_prefix("trusted comment: "))
        .ok_or("no trusted comment")?;
    let global = decode(lines.next().unwrap_or_default().trim(), 64, "the global signature")?;
    let key_bytes: [u8; 32] = pk[10..].try_into().map_err(|_| "a public key of the wrong size")?;
    let key = ed25519_dalek::VerifyingKey::from_bytes(&key_bytes).map_err(|e| format!("the public key: {e}"))?;
    let global: [u8; 64] = global[..].try_into().map_err(|_| "a global signature of the wrong size")?;
    let mut signed = sig[10..].to_vec();
    signed.extend_from_slice(comment.as_bytes());
    key.verify_strict(&signed, &ed25519_dalek::Signature::from_bytes(&global))
        .map_err(|_| "its trusted comment is not signed by this key".to_string())?;
    Ok(comment.to_string())
}

fn decode(line: &str, len: usize, what: &str) -> Result<Vec<u8>, String> {
    match STANDARD.decode(line) {
        Ok(b) if b.len() == len => Ok(b),
        _ => Err(format!("{what} is not {len} bytes of base64")),
    }
}

/// The sha256 of `bundle.yaml` the builder names in a trusted comment
/// (`... bundle.yaml sha256:<hex>`), if it names one.
pub fn manifest_digest(comment: &str) -> Option<&str> {
    let named = comment.split_whitespace().find_map(|w| w.strip_prefix("sha256:"))?;
    comment.contains(MANIFEST_NAME).then_some(named)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Made by the minisign CLI 0.11: `minisign -S -t '...'` on a file.
    const PUBLIC: &str = "untrusted comment: minisign public key 2190B8C535B897DB
RWTbl7g1xbiQIRd/iVbbtKFqAZRDTe0GleuHFMP1gZOK7lq1IbzTM0jS
";
    const SIGNATURE: &str = "untrusted comment: signature from minisign secret key
RUTbl7g1xbiQIbIAUl1e0RHxb0o1TwBb5UR79Iq++fib183T7BxyovsDSsRhwPwnJGmu1bhIMpCsuJ7CYu2nB2MVkz/O0FZtSQQ=
trusted comment: kubexm bundle t bundle.yaml sha256:abc
zbHIeT9+yRyICrrnB/IpGDZN/cXO4Eg1Pv4U9VJiDbFgoHrIoRS2iFbk7uPcwg/Oos63FOPeGEdZb+32cqcpAw==
";

    #[test]
    fn a_comment_signed_by_the_minisign_cli_is_authenticated() -> Result<(), Box<dyn std::error::Error>> {
        let comment = authenticate(PUBLIC, SIGNATURE)?;
        assert_eq!(comment, "kubexm bundle t bundle.yaml sha256:abc");
        assert_eq!(manifest_digest(&comment), Some("abc"));
        // The key's base64 line alone is accepted too, as minisign -P takes it.
        assert!(authenticate(PUBLIC.lines().nth(1).ok_or("no key line")?, SIGNATURE).is_ok());
        Ok(())
    }

    #[test]
    fn an_edited_comment_is_refused() {
        let edited = SIGNATURE.replace("sha256:abc", "sha256:abd");
        let err = authenticate(PUBLIC, &edited).unwrap_err();
        assert!(err.contains("not signed by this key"), "{err}");
        assert_eq!(manifest_digest("some other file sha256:abc"), None);
    }
}
